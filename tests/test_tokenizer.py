"""The tokenizer (sf_trt.tokenizer) on the real model's vocabulary."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


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
def test_tokenizer_round_trips(text, real_tokenizer):
    tok = real_tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    stream = tok.stream()
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


def test_tokenizer_ids_and_special_tokens(real_tokenizer):
    tok = real_tokenizer
    assert tok.encode("Hello, world!") == [19556, 28, 905, 17]
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.encode("2024") == [34, 32, 34, 36]  # SmolLM's pre-tokenizer splits digits one by one
    assert (tok.bos, tok.eos) == (1, 2)


def test_chat_template(real_tokenizer):
    tok = real_tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    no_prompt = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert no_prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
