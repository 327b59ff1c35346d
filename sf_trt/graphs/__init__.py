"""ONNX graphs the runtime builds in memory and runs.

* :mod:`.verify` — the verify-and-sample graph (greedy, Gumbel-max with top-k /
  top-p, a counter-based hash keyed by position): what draws every token, on
  onnxruntime (:mod:`sf_trt.backends.ort_sampler`) and, built by ``sf-trt build``, on TensorRT;
* :mod:`.logprobs` — LogSoftmax + TopK over the rows that drew the tokens, for
  requests that ask for logprobs (:mod:`sf_trt.backends.ort_logprobs` runs it);
* :mod:`.copy_model` — the fake's copy model (SPEC behaviour 8);
* :mod:`.builder` — the one helper every graph is written with, export's decoder
  included, and the opset they share.

The runtime owns these graphs because it runs them; ``sf_trt.export`` saves
them beside the decoder and turns them into engines, importing them from here.
"""
