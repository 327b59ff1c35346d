"""A GGUF's sentencepiece vocabulary (``tokenizer.ggml.model`` ``llama``: Gemma, Llama 2, Mistral,
Phi-3) built into a ``tokenizers`` tokenizer, as transformers converts one.

The pieces are BPE over ``▁``-for-space text with byte fallback (``<0x0A>`` pieces for bytes no
piece covers). The merges come from the scores: every split of a piece into two pieces is a merge,
ranked by the piece's score, highest first (transformers' ``SentencePieceExtractor``). Control
tokens (type 3) are special added tokens, user-defined ones (type 4, Gemma's ``\\n`` and runs of
spaces) plain added tokens, matched before the model as sentencepiece does.
"""

from __future__ import annotations

from typing import Any, Sequence

from .base import TokenizerError

__all__ = ["hf_from_sentencepiece", "SPACE"]

SPACE = "\u2581"
"""``▁``: the piece text for a space."""
_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6  # llama.cpp token types


def hf_from_sentencepiece(
    tokens: Sequence[str], scores: Sequence[float] | None, *, token_types: Sequence[int] | None, add_space_prefix: bool, unk: int | None,
) -> Any:
    """The ``tokenizers`` tokenizer of a sentencepiece vocabulary (module docstring)."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    if not tokens or scores is None or len(scores) != len(tokens):
        raise TokenizerError("no vocabulary or scores (expected tokenizer.ggml.tokens / tokenizer.ggml.scores of one length)")
    types = list(token_types) if token_types is not None else [1] * len(tokens)
    if len(types) != len(tokens) or not all(isinstance(t, str) for t in tokens):
        raise TokenizerError("sentencepiece vocabulary malformed (expected one string and one type per token)")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = []
    for piece, i in vocab.items():
        if types[i] != 1:
            continue
        found = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(left, right, float(scores[i]), vocab[left], vocab[right]) for left, right in found]
    merges.sort(key=lambda m: (-m[2], m[3], m[4]))
    try:
        unk_token = tokens[unk] if unk is not None and 0 <= unk < len(tokens) else None
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=[(m[0], m[1]) for m in merges], unk_token=unk_token, fuse_unk=True, byte_fallback=True))
        steps = ([normalizers.Prepend(SPACE)] if add_space_prefix else []) + [normalizers.Replace(" ", SPACE)]
        hf.normalizer = normalizers.Sequence(steps)
        hf.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                       + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
        hf.add_tokens([
            AddedToken(tok, special=(t == _CONTROL), normalized=False) for tok, t in zip(tokens, types) if t in (_CONTROL, _USER_DEFINED)
        ])
    except Exception as exc:  # the tokenizers library raises its own Exception on a bad vocabulary
        raise TokenizerError(f"the tokenizers library refuses this vocabulary ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    return hf
