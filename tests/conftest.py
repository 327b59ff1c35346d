"""Shared fixtures: a tiny random Llama, the real SmolLM2 model, pass schedules.

The real model is fetched and exported once per machine into the user cache
(``$SF_TRT_CACHE`` or ``~/.cache/sf_trt``, see :mod:`sf_trt.models`); a session
reuses that export when its recorded GGUF digest matches.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest

from sf_trt.primitives import Rows

# -- pass schedules -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Schedules:
    """Ways to feed lanes' token sequences through a backend, pass by pass.

    A schedule is a list of passes; a pass is a list of ``(lane, n_rows)`` in the
    order the rows are packed. :meth:`run` returns each lane's logits at every
    position it was fed, ``{lane: [n, vocab] float32}``.
    """

    seqs: dict[int, np.ndarray]

    def plain(self) -> list[list[tuple[int, int]]]:
        """One row per pass, one lane at a time: what plain decoding does."""
        return [[(lane, 1)] for lane, s in self.seqs.items() for _ in range(len(s))]

    def chunked(self, rows: int) -> list[list[tuple[int, int]]]:
        """Each lane alone, ``rows`` rows per pass."""
        out = []
        for lane, s in self.seqs.items():
            for start in range(0, len(s), rows):
                out.append([(lane, min(rows, len(s) - start))])
        return out

    def mixed(self, sizes: list[int], order: Callable[[int], list[int]]) -> list[list[tuple[int, int]]]:
        """All lanes share passes; lane l takes ``sizes[(l + k) % len(sizes)]`` rows in
        pass k, lanes packed in ``order(k)``."""
        used = set(order(0)) | set(order(1))  # lanes the schedule feeds
        left = {lane: len(s) for lane, s in self.seqs.items() if lane in used}
        out, k = [], 0
        while any(left.values()):
            p = []
            for lane in order(k):
                n = min(sizes[(lane + k) % len(sizes)], left[lane])
                if n:
                    p.append((lane, n))
                    left[lane] -= n
            out.append(p)
            k += 1
        return out

    def run(self, prims, schedule) -> dict[int, np.ndarray]:
        logits: dict[int, list] = {lane: [None] * len(s) for lane, s in self.seqs.items()}
        for lane in self.seqs:
            prims.release(lane)
        for p in schedule:
            lanes, positions, tokens = [], [], []
            for lane, n in p:
                start = prims.state_len(lane)
                lanes += [lane] * n
                positions += range(start, start + n)
                tokens += list(self.seqs[lane][start:start + n])
            out = prims.forward(
                Rows(np.asarray(lanes, np.int64), np.asarray(positions, np.int64), np.asarray(tokens, np.int64), np.arange(len(lanes), dtype=np.int64))
            )
            for i, (lane, pos) in enumerate(zip(lanes, positions)):
                logits[lane][pos] = out[i].copy()
        for lane in self.seqs:
            prims.release(lane)
        vocab = prims.capabilities.vocab
        # each lane's rows up to where the schedule stopped feeding it
        return {lane: np.stack([r for r in v if r is not None] or [np.zeros(vocab, np.float32)])[: sum(r is not None for r in v)] for lane, v in logits.items()}


@pytest.fixture
def schedules():
    return Schedules


# -- the tiny random model ---------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny():
    """``(cfg, weights)`` of the tiny random Llama."""
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    return cfg, random_llama_weights(cfg, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny, tmp_path_factory):
    """A model directory holding the tiny model's graph (no tokenizer)."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.pipeline import write_model_dir

    cfg, weights = tiny
    return write_model_dir(tmp_path_factory.mktemp("tiny") / "model", cfg, build_decoder_graph(cfg, weights))


def _export_tiny(tmp_path_factory, name: str, cfg, weights, weight_dtype: str):
    """A model directory (no tokenizer) of ``(cfg, weights)`` exported with ``weight_dtype``."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.pipeline import write_model_dir

    graph = build_decoder_graph(cfg, weights, weight_dtype=weight_dtype)
    return write_model_dir(tmp_path_factory.mktemp(name) / "model", cfg, graph, weight_dtype=weight_dtype)


@pytest.fixture(scope="session")
def tiny_int8_model_dir(tiny, tmp_path_factory):
    """The tiny model with int8 weights."""
    return _export_tiny(tmp_path_factory, "tiny8", *tiny, weight_dtype="int8")


@pytest.fixture(scope="session")
def tiny_q4_model_dir(tiny, tmp_path_factory):
    """The tiny model with q4 weights (float matrices requantized to 4 bits with zero points, a Q8_0
    embedding and lm_head, in MatMulNBits)."""
    return _export_tiny(tmp_path_factory, "tinyq4", *tiny, weight_dtype="q4")


def k_quant_raw(rng, kind: str, out: int, k: int):
    """Random Q4_K, Q5_K or Q6_K bytes ``[out, k / 256 * block bytes]`` of weights about N(0, 1/k):
    Q4_K/Q5_K with 6-bit scales ``sc`` in 16..63 and mins about half the range (``dmin = 8 d``), so
    each block is centred near 0; Q6_K with int8 scales; the values anything."""
    import numpy as np

    n, steps = k // 256, {"Q4_K": 15, "Q5_K": 31, "Q6_K": 63}[kind]
    size = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    raw = rng.integers(0, 256, (out, n, size), dtype=np.uint8)
    d = (rng.uniform(0.5, 1.5, (out, n)) * 1.7 / np.sqrt(k) / steps / 40).astype(np.float16)
    if kind == "Q6_K":
        raw[..., 192:208] = rng.integers(-63, 64, (out, n, 16)).astype(np.int8).view(np.uint8)
        raw[..., 208:210] = d[..., None].view(np.uint8)
        return raw.reshape(out, -1)
    raw[..., 0:2] = d[..., None].view(np.uint8)
    raw[..., 2:4] = (d * np.float16(8))[..., None].view(np.uint8)
    sc = rng.integers(16, 64, (out, n, 8)).astype(np.uint8)
    mn = np.clip(np.rint(steps / 2 * sc / 8 + rng.integers(-2, 3, sc.shape)), 0, 63).astype(np.uint8)
    raw[..., 4:8] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    raw[..., 8:12] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    raw[..., 12:16] = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
    return raw.reshape(out, -1)


MIXED_Q4_BLOCKS = {
    0: {"wq": "Q4_K", "wk": "Q4_K", "wo": "Q4_0", "w_gate": "Q4_1", "w_up": "Q4_0", "w_down": "Q4_K"},  # wv: requantized
    1: {"wq": "Q4_0", "wk": "Q4_0", "wv": "Q4_0", "w_gate": "Q4_K", "w_up": "Q4_K", "w_down": "Q4_1"},  # wo: requantized
}
"""The tiny mixed model's GGUF block types per layer matrix (the rest float, as a Q6_K or F16 tensor reads)."""
MIXED_GGUF_BLOCKS = {
    0: {"wq": "Q4_K", "wk": "Q4_K", "wv": "Q6_K", "wo": "Q5_K", "w_gate": "Q5_0", "w_up": "Q5_1", "w_down": "Q6_K"},
    1: {"wq": "Q4_0", "wk": "Q4_0", "wv": "Q4_0", "w_gate": "Q4_1", "w_up": "Q4_1", "w_down": "Q8_0"},  # wo: float
}
"""The tiny model of ``weights="gguf"``'s forms: 8 bits in blocks of 16 (Q6_K, Q4_K widened beside it),
8 bits with offsets (Q5_K, Q5_1), 4 bits (Q4_0; Q4_1 with offsets), Q8_0, a float matrix in Q8_0."""


def _mixed_blocks(plan: dict, seed: int):
    """``(cfg, weights)`` of a tiny Llama (dims multiples of 256, as K-quants need) whose layer
    matrices are held in the GGUF block types of ``plan`` (the float arrays their values); the
    embedding in Q8_0."""
    import dataclasses

    import numpy as np
    from sf_trt.export.quantize import GgmlBlocks
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config(hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn=256)
    weights = random_llama_weights(cfg, seed=seed)
    rng = np.random.default_rng(seed)
    blocks = {}
    for i, kinds in plan.items():
        for field, kind in kinds.items():
            w = getattr(weights.layers[i], field)
            given = GgmlBlocks(kind, k_quant_raw(rng, kind, *w.shape)) if kind.endswith("_K") else GgmlBlocks.quantize(w, kind)
            setattr(weights.layers[i], field, given.dequantize())
            blocks[f"layers.{i}.{field}"] = (kind, given.raw)
    embd = GgmlBlocks.quantize(weights.tok_embd, "Q8_0")
    blocks["tok_embd"] = ("Q8_0", embd.raw)
    return cfg, dataclasses.replace(weights, tok_embd=embd.dequantize(), blocks=blocks)


@pytest.fixture(scope="session")
def tiny_mixed_q4():
    """A tiny Llama whose matrices are held in every form ``weights="q4"`` takes: Q4_0, Q4_1, Q4_K
    blocks carried as they are and float matrices requantized, mixed within the fused q/k/v and
    gate/up matrices (``MIXED_Q4_BLOCKS``)."""
    return _mixed_blocks(MIXED_Q4_BLOCKS, 3)


@pytest.fixture(scope="session")
def tiny_mixed_gguf():
    """A tiny Llama whose matrices are held in every form ``weights="gguf"`` takes (``MIXED_GGUF_BLOCKS``)."""
    return _mixed_blocks(MIXED_GGUF_BLOCKS, 4)


@pytest.fixture(scope="session")
def tiny_mixed_gguf_model_dir(tiny_mixed_gguf, tmp_path_factory):
    """:func:`tiny_mixed_gguf` exported with gguf weights."""
    return _export_tiny(tmp_path_factory, "tinymixedgguf", *tiny_mixed_gguf, weight_dtype="gguf")


@pytest.fixture(scope="session")
def tiny_mixed_q4_model_dir(tiny_mixed_q4, tmp_path_factory):
    """:func:`tiny_mixed_q4` exported with q4 weights."""
    return _export_tiny(tmp_path_factory, "tinymixedq4", *tiny_mixed_q4, weight_dtype="q4")


@pytest.fixture(scope="session")
def tiny_mixed_int4_model_dir(tiny_mixed_q4, tmp_path_factory):
    """:func:`tiny_mixed_q4` exported with int4 weights: its Q4_0, Q4_1 and Q4_K blocks requantized too."""
    return _export_tiny(tmp_path_factory, "tinymixedint4", *tiny_mixed_q4, weight_dtype="int4")


@pytest.fixture(scope="session")
def tiny_fp16_model_dir(tiny, tmp_path_factory):
    """The tiny model exported with fp16 compute (weights, matmuls and KV cache in float16)."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.pipeline import write_model_dir

    cfg, weights = tiny
    return write_model_dir(tmp_path_factory.mktemp("tiny16") / "model", cfg, build_decoder_graph(cfg, weights, precision="fp16"))


@pytest.fixture(scope="session")
def tiny_mha_model_dir(tmp_path_factory):
    """A tiny model without GQA (n_heads == n_kv_heads): attention has M = T query rows."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.pipeline import write_model_dir
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config(n_heads=4, n_kv_heads=4)
    return write_model_dir(tmp_path_factory.mktemp("tiny_mha") / "model", cfg, build_decoder_graph(cfg, random_llama_weights(cfg, 1)))


# -- the real model --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_gguf():
    """The SmolLM2-135M-Instruct GGUF, fetched into the user cache on first use."""
    from sf_trt.models import ModelError, default_gguf_path

    try:
        return default_gguf_path(progress=False)
    except ModelError as exc:
        pytest.fail(f"the real model could not be fetched: {exc}")


@pytest.fixture(scope="session")
def real_model_dir(real_gguf):
    """The real model exported once with float32 weights (reused while its GGUF digest matches)."""
    from sf_trt.export.pipeline import default_model_dir

    return default_model_dir(progress=False, weight_dtype="float32")


@pytest.fixture(scope="session")
def real_int8_model_dir(real_gguf):
    """The real model exported with int8 weights."""
    from sf_trt.export.pipeline import default_model_dir

    return default_model_dir(progress=False, weight_dtype="int8")


@pytest.fixture(scope="session")
def real_int4_model_dir(real_gguf):
    """The real model exported with int4 weights: every matrix requantized, its 49152-row lm_head too."""
    from sf_trt.export.pipeline import default_model_dir

    return default_model_dir(progress=False, weight_dtype="int4")


@pytest.fixture(scope="session")
def real_q4_model_dir(real_gguf):
    """The real model exported with q4 weights: the GGUF's own Q4_1 and Q8_0 blocks."""
    from sf_trt.export.pipeline import default_model_dir

    return default_model_dir(progress=False, weight_dtype="q4")


@pytest.fixture(scope="session")
def real_fp16_model_dir(real_gguf):
    """The real model exported with fp16 compute (float32 weights rounded to float16)."""
    from sf_trt.export.pipeline import default_model_dir

    return default_model_dir(progress=False, weight_dtype="float32", precision="fp16")


@pytest.fixture(scope="session")
def real_reader(real_gguf):
    from sf_trt.export.gguf_llama import open_reader

    return open_reader(real_gguf)


@pytest.fixture(scope="session")
def real_weights(real_reader):
    """``(cfg, weights)`` of the real model, float32 as dequantized from the GGUF."""
    from sf_trt.export.gguf_llama import load_gguf

    return load_gguf(real_reader)


@pytest.fixture(scope="session")
def real_prims(real_model_dir):
    """The real model on onnxruntime: 4 lanes of 256 positions."""
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    prims = OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=256)
    yield prims
    prims.close()


@pytest.fixture(scope="session")
def real_tokenizer(real_model_dir):
    """The real model's tokenizer, from its model directory."""
    from sf_trt.tokenizer import Tokenizer

    return Tokenizer.load(real_model_dir)
