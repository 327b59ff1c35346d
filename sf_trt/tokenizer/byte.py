"""Bytes as tokens: :class:`ByteTokenizer`, the fake backend's tokenizer."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .base import StreamDecoder, TokenizerError, check_messages

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Bytes as tokens: the tokenizer of the fake backend, for tests and demos.

    Token ``b < 256`` is byte ``b``; ids from 256 up to ``vocab - 1`` are special
    tokens (``<|special:N|>``), and so is ``eos`` wherever it lies. Text encodes to
    its UTF-8 bytes (a byte that is a special id, like 0xFF when ``eos = 255``, never
    occurs in UTF-8). The chat template writes ``role: content`` lines and, for
    generation, ``assistant:``. Same interface as :class:`Tokenizer`.
    """

    def __init__(self, vocab: int = 257, eos: int = 256) -> None:
        if not 1 <= vocab or not 0 <= eos < vocab:
            raise TokenizerError(f"ByteTokenizer: need vocab >= 1 and 0 <= eos < vocab (got {vocab}, {eos})")
        self.vocab_size = int(vocab)
        self.eos = int(eos)
        self.bos = int(eos)
        self.special_ids = frozenset({self.eos} | set(range(256, self.vocab_size)))
        self._token_bytes = [
            f"<|special:{i}|>".encode() if i in self.special_ids else bytes([i]) for i in range(self.vocab_size)
        ]
        self.chat_template = "byte-chat"
        self.max_token_bytes = 1  # a text of N bytes is N tokens

    def encode(self, text: str) -> list[int]:
        ids = list(text.encode("utf-8"))
        bad = [i for i in ids if i >= self.vocab_size or i in self.special_ids]
        if bad:
            raise TokenizerError(f"ByteTokenizer.encode: byte {bad[0]} is not an ordinary token of a vocabulary of {self.vocab_size}")
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        stream = self.stream(skip_special=skip_special)
        return stream.extend(ids) + stream.flush()

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self._token_bytes, self.special_ids, skip_special)

    def token_bytes(self, token: int) -> bytes:
        return self._token_bytes[int(token)]

    def apply_chat_template(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        check_messages(messages)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")

    def encode_chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """Ids of the chat text (bytes have no control tokens to forge)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra))
