"""tools/precision_agreement.py: the fp16 decoder's greedy tokens against fp32's on the bench prompts (onnxruntime, CPU)."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_fp16_greedy_tokens_agree_with_fp32_on_the_bench_prompts(real_model_dir, real_fp16_model_dir, real_tokenizer, capsys, load_tool):
    """The number docs/tensorrt.md reports (192 tokens there; 32 here): teacher-forced top-1
    agreement of the fp16 export with fp32 at least 97%, the floor tools/trt_device_check.py (d)
    holds TensorRT fp16 to."""
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    tool = load_tool("precision_agreement")
    prompts = tool.bench_prompt_ids(real_tokenizer)
    assert len(prompts) == 8
    context = max(len(p) for _, p in prompts) + 33
    with OrtDecoderPrimitives(real_model_dir, max_lanes=1, max_context=context) as ref, \
            OrtDecoderPrimitives(real_fp16_model_dir, max_lanes=1, max_context=context) as cand:
        rows = tool.agreement(ref, cand, prompts, 32)
    s = tool.summary(rows)
    with capsys.disabled():
        tool.print_table(rows, "fp16 vs fp32 (test, 32 tokens)")
    assert s["tokens"] >= 8 * 16 and s["forced_agreement"] >= 0.97, s
    assert all(r.identical_prefix <= r.tokens and r.forced_matches <= r.tokens for r in rows)
