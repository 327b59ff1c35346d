"""What every tokenizer shares: :class:`TokenizerError`, the incremental
:class:`StreamDecoder`, and the check of a chat's messages."""

from __future__ import annotations

import codecs
from typing import Any, Iterable, Sequence

__all__ = ["TokenizerError", "StreamDecoder", "check_messages"]


class TokenizerError(ValueError):
    """A tokenizer that cannot be built or used; the message says what was found."""


class StreamDecoder:
    """Turns ids into text as they come, holding back bytes of an unfinished character.

    ``push(id) -> str`` returns the text completed by that token (possibly "");
    ``flush() -> str`` the rest (U+FFFD for an incomplete trailing sequence).
    The concatenation of everything returned equals ``Tokenizer.decode(ids)``.
    """

    def __init__(self, token_bytes: Sequence[bytes], special: frozenset[int], skip_special: bool = False) -> None:
        self._bytes = token_bytes
        self._special = special
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        token = int(token)
        if not 0 <= token < len(self._bytes):
            raise TokenizerError(f"StreamDecoder.push: token {token} outside 0..{len(self._bytes) - 1}")
        if self._skip_special and token in self._special:
            return ""
        return self._utf8.decode(self._bytes[token])

    def extend(self, tokens: Iterable[int]) -> str:
        return "".join(self.push(t) for t in tokens)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise TokenizerError(f"apply_chat_template: messages must be a non-empty list of messages (got {type(messages).__name__})")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TokenizerError(f"apply_chat_template: message {i} must be a dict with str 'role' and 'content' (got {m!r})")
