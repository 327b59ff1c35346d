"""Byte-level BPE vocabularies as GGUF files state them, built into a ``tokenizers``
tokenizer.

A GGUF ``gpt2``-model vocabulary is byte-level BPE: ``tokenizer.ggml.tokens`` are
the byte-level strings (GPT-2's byte-to-unicode alphabet, :func:`byte_alphabet`),
``tokenizer.ggml.merges`` the merge ranks, and ``tokenizer.ggml.token_type`` marks
control tokens (``<|im_start|>`` ...), which are added as special tokens so that
text produced by the chat template encodes them as one id each. The pre-tokenizer
follows ``tokenizer.ggml.pre``: for ``smollm`` (SmolLM / SmolLM2) llama.cpp splits
every digit on its own and then applies the GPT-2 regex, which is HF's
``Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False)])``.
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import TokenizerError

__all__ = ["byte_alphabet", "pre_tokenizer", "hf_from_vocab"]

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types

# Pre-tokenizers by ``tokenizer.ggml.pre`` (llama.cpp's names) that we know how to build.
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_GPT2 = {"gpt2", "default", "mpt", "olmo", "jais"}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def pre_tokenizer(pre: str):
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2:
        return byte_level
    raise TokenizerError(
        f"tokenizer.ggml.pre {pre!r} is not supported (known: {sorted(_DIGITS_THEN_GPT2 | _GPT2)})"
    )


def hf_from_vocab(tokens: Sequence[str], merges: Sequence[str], *, token_types: Sequence[int] | None, pre: str, bos: int, eos: int) -> Any:
    """The ``tokenizers`` tokenizer of a byte-level BPE vocabulary (GPT-2 alphabet strings),
    its merges (``"a b"``), llama.cpp token types (control and user-defined tokens become
    added tokens) and pre-tokenizer name (``tokenizer.ggml.pre``); ``bos``/``eos`` are
    checked against the vocabulary. TokenizerError says what is wrong."""
    from tokenizers import AddedToken, decoders, models
    from tokenizers import Tokenizer as HFTokenizer

    if not tokens or merges is None:
        raise TokenizerError("no vocabulary or merges (expected tokenizer.ggml.tokens / tokenizer.ggml.merges)")
    types = token_types if token_types is not None else [1] * len(tokens)
    if not all(isinstance(t, str) for t in tokens) or not all(isinstance(m, str) and " " in m for m in merges):
        raise TokenizerError("vocabulary or merges malformed (expected strings, merges as 'a b')")
    if len(types) != len(tokens):
        raise TokenizerError(f"{len(types)} token types for {len(tokens)} tokens")
    if not (0 <= int(bos) < len(tokens) and 0 <= int(eos) < len(tokens)):
        raise TokenizerError(f"bos/eos {bos}/{eos} outside the vocabulary of {len(tokens)}")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre_tok = pre_tokenizer(pre)
    try:
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        hf.pre_tokenizer = pre_tok
        hf.decoder = decoders.ByteLevel()
        added = [
            AddedToken(tok, special=(t == _CONTROL), normalized=False)
            for tok, t in zip(tokens, types)
            if t in (_CONTROL, _USER_DEFINED)
        ]
        hf.add_tokens(added)  # existing vocabulary entries keep their ids
    except Exception as exc:  # the tokenizers library raises its own Exception on a bad vocabulary
        raise TokenizerError(f"the tokenizers library refuses this vocabulary ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return hf
