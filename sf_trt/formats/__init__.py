"""The file formats the runtime reads, stated once.

* :mod:`.model_dir` — a model directory (``config.json``, the decoder graphs,
  the verify graph, the tokenizer files): its layout, its config keys, the
  decoder graph's input and output names, :class:`~.model_dir.LlamaConfig`;
* :mod:`.shapes` — engine I/O and profiles: dynamic dim names and their roles;
* :mod:`.manifest` — ``engines/manifest.json``, the record of built engines;
* :mod:`.files` — file digests.

``sf_trt.export`` writes these formats by importing them from here; the runtime
never imports the build side.
"""
