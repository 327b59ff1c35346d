"""The logprobs graph (sf_trt.graphs.logprobs) and its onnxruntime runner
(sf_trt.backends.ort_logprobs): log_softmax values, the top tokens in order, row independence."""

from __future__ import annotations

import numpy as np
import pytest

from sf_trt.backends.ort_logprobs import OrtLogprobs
from sf_trt.engine import TOP_LOGPROBS_MAX


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("vocab", [5, 37, 64, 300])
def test_the_graph_is_log_softmax_with_the_top_tokens_in_order(vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.normal(0, 3, (12, vocab)).astype(np.float32)
    logits[0, :3] = logits[0].max() + 1  # a three-way tie at the top
    tokens = rng.integers(0, vocab, 12)
    lp, ids, top = OrtLogprobs(vocab).run(logits, tokens)
    want = log_softmax(logits)
    n = min(vocab, TOP_LOGPROBS_MAX)
    assert lp.shape == (12,) and ids.shape == top.shape == (12, n)
    np.testing.assert_allclose(lp, want[np.arange(12), tokens], atol=1e-5)
    np.testing.assert_allclose(top, np.take_along_axis(want, ids, axis=1), atol=1e-5)
    assert (np.diff(top, axis=1) <= 0).all()
    np.testing.assert_allclose(top[:, 0], want.max(axis=1), atol=1e-5)
    assert ids[0, :3].tolist() == [0, 1, 2]  # ties: the lower id first


def test_a_rows_logprobs_depend_on_nothing_but_the_row():
    vocab = 300
    rng = np.random.default_rng(1)
    runner = OrtLogprobs(vocab)
    row = rng.normal(0, 4, (1, vocab)).astype(np.float32)
    alone = runner.run(row, np.array([7]))
    for others in (1, 5, 17):
        batch = rng.normal(0, 4, (others, vocab)).astype(np.float32)
        at = int(rng.integers(0, others + 1))
        logits = np.concatenate([batch[:at], row, batch[at:]])
        tokens = np.concatenate([rng.integers(0, vocab, at), [7], rng.integers(0, vocab, others - at)])
        got = runner.run(logits, tokens)
        for a, b in zip(alone, got):
            np.testing.assert_array_equal(a[0], b[at])


def test_the_graph_checks_and_uses_only_the_ops_in_its_ops_md_section():
    import re
    from pathlib import Path

    import onnx

    from sf_trt.graphs.logprobs import build_logprobs_graph

    text = (Path(__file__).resolve().parents[2] / "export" / "OPS.md").read_text()
    listed = set(re.findall(r"^\| `([A-Za-z]+)` \|", text.split("\n## logprobs", 1)[1].split("\n## ", 1)[0], flags=re.M))
    for vocab in (37, 64):
        model = build_logprobs_graph(vocab)
        onnx.checker.check_model(model, full_check=True)
        used = {n.op_type for n in model.graph.node}
        assert used <= listed, sorted(used - listed)
    assert {"LogSoftmax", "TopK", "GatherElements"} <= used
