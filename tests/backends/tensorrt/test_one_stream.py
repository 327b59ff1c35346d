"""One stream: every torch op of the TensorRT backend runs on the runtime's stream.

TensorRT enqueues each run on the runtime's own CUDA stream; the K/V write-back
gathers rows of that run's ``new_kv`` and scatters them into the caches. A gather on
torch's default stream is ordered against neither (rare, silent cache corruption).
Here torch and tensorrt are stand-ins (tests/trt_fakes.py) that record the stream
current at each device op, and the real adapters, runners and primitives run a
decoder pass split across runs, a verify pass, and CUDA-graph replays over them.
"""

from __future__ import annotations

import pytest
from trt_fakes import FakeTorch, FakeTrt

from sf_trt.backends.tensorrt import BufferPlan, TensorRTPrimitives
from sf_trt.backends.tensorrt.device import TorchDevice
from sf_trt.backends.tensorrt.runners import TrtRunner
from sf_trt.export.decoder_graph import build_decoder_graph
from sf_trt.export.tiny import random_llama_weights, tiny_llama_config
from sf_trt.formats.shapes import ShapeLimits, derive_profiles
from sf_trt.graphs.verify import build_verify_graph
from sf_trt.primitives import Rows, SampleRows

import numpy as np

SHAPES = ShapeLimits(max_lanes=3, rows_per_lane=4, max_context=32)


def _backend(cuda_graphs: bool):
    torch = FakeTorch()
    cfg = tiny_llama_config()
    graphs = {"decoder": build_decoder_graph(cfg, random_llama_weights(cfg, seed=0)), "verify": build_verify_graph(cfg.vocab, 16)}
    plans = {name: BufferPlan.from_onnx(g, name=name, dims=derive_profiles(g, SHAPES).max_dims()) for name, g in graphs.items()}
    trt = FakeTrt(engines={name.encode(): plan for name, plan in plans.items()}, torch=torch)
    dev = TorchDevice(torch, 0)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    runners = [TrtRunner(trt, runtime, name, name.encode(), plans[name], dev, cuda_graphs=cuda_graphs) for name in ("decoder", "verify")]
    return torch, trt, dev, TensorRTPrimitives(*runners, dev, eos=cfg.eos, top_k_limit=16, max_rows_per_pass=24), cfg.vocab


def _rows(lanes, positions, tokens, logit_rows):
    return Rows(*(np.asarray(a, np.int64) for a in (lanes, positions, tokens, logit_rows)))


def _sample(n: int) -> SampleRows:
    return SampleRows(
        mode=np.ones(n, np.int64), temperature=np.full(n, 0.8, np.float32), top_p=np.ones(n, np.float32),
        top_k=np.zeros(n, np.int64), rng_counter_base=np.arange(n, dtype=np.int64), position=np.arange(n, dtype=np.int64),
        draft=np.full(n, -1, np.int64),
    )


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_every_device_op_of_a_pass_runs_on_the_runtimes_stream(cuda_graphs):
    torch, trt, dev, prims, vocab = _backend(cuda_graphs)
    torch.log.clear()
    # lane 1: 10 rows = three runs of 4 (its K/V written back between runs), logit rows out of
    # order and named twice (the gather path); lane 0 beside it; then a plain step each
    logits = prims.forward(_rows([0, 0] + [1] * 10, [0, 1] + list(range(10)), list(range(12)), [11, 2, 2, 0, 7]))
    prims.verify_sample(logits, _sample(5))
    prims.logits_host(logits)
    for step in range(2):
        out = prims.forward(_rows([0, 1], [2 + step, 10 + step], [5, 6], [0, 1]))
        prims.verify_sample(out, _sample(2))
    ops = {op for op, _ in torch.log}
    assert {"getitem", "setitem", "to_device", "zeros", "cpu"} <= ops  # the gathers and the write-back were seen
    assert torch.streams_used() == {dev.stream.name}, sorted(set(torch.log) - {(op, dev.stream.name) for op in ops})
    assert trt.enqueued and {handle for _, handle, _ in trt.enqueued} == {dev.stream.cuda_stream}
    assert prims.graphs_captured() == {"decoder": cuda_graphs, "verify": cuda_graphs}
    if cuda_graphs:
        assert ("replay", dev.stream.name) in torch.log and ("copy_", dev.stream.name) in torch.log


def test_the_stand_in_torch_does_see_an_op_off_the_stream():
    """The check above is not vacuous: an op outside ``on_stream`` is recorded on the default stream."""
    torch, _, dev, prims, _ = _backend(False)
    buf = dev.zeros((4,), "float32")
    torch.log.clear()
    buf[np.arange(2)]  # what adapters.py did before: a gather outside the stream
    assert torch.streams_used() == {"default"}
    with dev.on_stream():
        buf[np.arange(2)]
    assert torch.streams_used() == {"default", dev.stream.name}


def test_the_copy_models_runs_are_on_the_runtimes_stream_too():
    """The TensorRT fake: its token-history writes and the logit rows of a pass split into runs."""
    from sf_trt.graphs.copy_model import build_copy_graph

    torch = FakeTorch()
    graphs = {"copy_model": build_copy_graph(vocab=64, eos=63, max_lanes=4, max_context=32), "verify": build_verify_graph(64, 16)}
    shapes = ShapeLimits(max_lanes=4, rows_per_lane=2, max_context=32)
    plans = {name: BufferPlan.from_onnx(g, name=name, dims=derive_profiles(g, shapes).max_dims()) for name, g in graphs.items()}
    trt = FakeTrt(engines={name.encode(): plan for name, plan in plans.items()}, torch=torch)
    dev = TorchDevice(torch, 0)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    runners = [TrtRunner(trt, runtime, name, name.encode(), plans[name], dev, cuda_graphs=True) for name in ("copy_model", "verify")]
    prims = TensorRTPrimitives(*runners, dev, eos=63, top_k_limit=16, max_rows_per_pass=32)
    torch.log.clear()
    logits = prims.forward(_rows([2] * 11, range(11), range(11), range(11)))  # 11 logit rows: two runs of 8
    prims.verify_sample(logits, _sample(11))
    assert {"setitem", "getitem", "to_device", "replay"} <= {op for op, _ in torch.log}
    assert torch.streams_used() == {dev.stream.name}
    assert prims.graphs_captured() == {"copy_model": True, "verify": True}
