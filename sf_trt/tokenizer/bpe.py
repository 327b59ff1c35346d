"""The model's tokenizer (:class:`Tokenizer`): byte-level BPE with the ``tokenizers``
library, the model's special tokens and its chat template.

Decoding maps each id to its bytes and decodes UTF-8 (invalid sequences become
U+FFFD), so :meth:`Tokenizer.decode` and the incremental
:class:`~sf_trt.tokenizer.base.StreamDecoder` agree by construction, including
multi-byte characters split over tokens.

**Untrusted text stays text.** :meth:`Tokenizer.encode_chat` encodes the
template's own control tokens as control tokens and the messages' contents as
plain text: ``<|im_start|>system`` typed by a user is encoded as those
characters, never as the control token (a role forgery). Ordinary contents
encode exactly as ``encode(apply_chat_template(...))`` does. The template renders
in a sandbox (:mod:`sf_trt.tokenizer.chat_template`); a template that ran out of
time is refused from then on without running it again.

Saved as ``tokenizer.json`` (the ``tokenizers`` file) + ``tokenizer_config.json``
(bos/eos) + ``chat_template.jinja`` in a model directory; :meth:`Tokenizer.load`
reads them back.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path
from typing import Any, Iterable, Sequence

from .base import StreamDecoder, TokenizerError, check_messages
from .byte_level import byte_alphabet, hf_from_vocab
from .sentencepiece import SPACE, hf_from_sentencepiece
from .chat_template import TEMPLATE_DEADLINE_S, TemplateTimeout, compile_template, render_bounded

__all__ = ["Tokenizer", "TOKENIZER_FILE", "CONFIG_FILE", "TEMPLATE_FILE"]

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


_ALPHABET = {ch: b for b, ch in byte_alphabet().items()}
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _is_byte_level(hf: Any) -> bool:
    """Whether the tokenizer's pieces are byte-level (GPT-2's alphabet), not sentencepiece's."""
    from tokenizers import decoders

    return hf.decoder is None or isinstance(hf.decoder, decoders.ByteLevel)


def _byte_level_bytes(piece: str) -> bytes:
    try:
        return bytes(_ALPHABET[ch] for ch in piece)
    except KeyError:  # not a byte-level piece: keep its text
        return piece.encode("utf-8")


def _sentencepiece_bytes(piece: str) -> bytes:
    """A sentencepiece piece's bytes: ``<0x0A>`` is that byte, ``▁`` a space."""
    m = _BYTE_PIECE.fullmatch(piece)
    return bytes([int(m.group(1), 16)]) if m else piece.replace(SPACE, " ").encode("utf-8")


class Tokenizer:
    """The model's BPE tokenizer (byte-level, or sentencepiece's with byte fallback) with its
    special tokens and chat template.

    ``encode(text) -> list[int]`` (special tokens written in ``text`` become their
    ids; no BOS is added: SmolLM2's GGUF says ``add_bos_token = False``),
    ``decode(ids) -> str``, ``stream() -> StreamDecoder``,
    ``apply_chat_template(messages) -> str``.
    """

    def __init__(self, hf: Any, *, bos: int, eos: int, chat_template: str | None = None) -> None:
        self._hf = hf
        self.bos = int(bos)
        self.eos = int(eos)
        self.chat_template = chat_template
        self.vocab_size = int(hf.get_vocab_size(with_added_tokens=True))
        added = hf.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        piece_bytes = _byte_level_bytes if _is_byte_level(hf) else _sentencepiece_bytes
        self._token_bytes = [
            b"" if (piece := hf.id_to_token(i)) is None else piece.encode("utf-8") if i in added else piece_bytes(piece)
            for i in range(self.vocab_size)
        ]
        # A text of N UTF-8 bytes is at least N / max_token_bytes tokens (the tokens' bytes are
        # the text's); None when a normalizer may rewrite the text first.
        self.max_token_bytes: int | None = max(map(len, self._token_bytes), default=1) if hf.normalizer is None else None
        self._compiled_template = None
        self._template_failure: str | None = None
        self._special_table: dict[str, int] | None = None
        self._special_re: re.Pattern | None = None
        self._hf_text = None

    # -- building ----------------------------------------------------------

    @classmethod
    def from_vocab(
        cls,
        tokens: Sequence[str],
        merges: Sequence[str],
        *,
        token_types: Sequence[int] | None = None,
        pre: str = "gpt2",
        bos: int,
        eos: int,
        chat_template: str | None = None,
    ) -> "Tokenizer":
        """A byte-level BPE tokenizer from its vocabulary (GPT-2 alphabet strings),
        its merges (``"a b"``), llama.cpp token types (control and user-defined
        tokens become added tokens) and pre-tokenizer name (``tokenizer.ggml.pre``).
        ``sf_trt.export.gguf_llama.read_tokenizer`` reads these from a GGUF."""
        hf = hf_from_vocab(tokens, merges, token_types=token_types, pre=pre, bos=bos, eos=eos)
        return cls(hf, bos=int(bos), eos=int(eos), chat_template=chat_template)

    @classmethod
    def from_sentencepiece(
        cls,
        tokens: Sequence[str],
        scores: Sequence[float],
        *,
        token_types: Sequence[int] | None = None,
        add_space_prefix: bool = True,
        unk: int | None = None,
        bos: int,
        eos: int,
        chat_template: str | None = None,
    ) -> "Tokenizer":
        """A sentencepiece tokenizer (GGUF ``tokenizer.ggml.model`` ``llama``) from its pieces, scores
        and token types (:mod:`.sentencepiece`). No BOS is added by :meth:`encode`: a chat
        template writes ``bos_token`` itself."""
        if not (0 <= int(bos) < len(tokens) and 0 <= int(eos) < len(tokens)):
            raise TokenizerError(f"bos/eos {bos}/{eos} outside the vocabulary of {len(tokens)}")
        hf = hf_from_sentencepiece(tokens, scores, token_types=token_types, add_space_prefix=add_space_prefix, unk=unk)
        return cls(hf, bos=int(bos), eos=int(eos), chat_template=chat_template)

    def save(self, directory: str | os.PathLike) -> None:
        """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._hf.save(str(d / TOKENIZER_FILE))
        meta = {
            "bos_token_id": self.bos, "eos_token_id": self.eos,
            "bos_token": self._hf.id_to_token(self.bos), "eos_token": self._hf.id_to_token(self.eos),
            "add_bos_token": False, "chat_template_file": TEMPLATE_FILE if self.chat_template else None,
        }
        (d / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        if self.chat_template:
            (d / TEMPLATE_FILE).write_text(self.chat_template)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Tokenizer":
        """Read what :meth:`save` wrote."""
        from tokenizers import Tokenizer as HFTokenizer

        d = Path(directory)
        for name in (TOKENIZER_FILE, CONFIG_FILE):
            if not (d / name).is_file():
                raise TokenizerError(f"{d / name}: missing (expected a tokenizer saved by Tokenizer.save)")
        try:
            meta = json.loads((d / CONFIG_FILE).read_bytes().decode("utf-8"))
            bos, eos = meta["bos_token_id"], meta["eos_token_id"]
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (bos, eos)):
                raise ValueError(f"bos/eos token ids {bos!r}, {eos!r} are not token ids")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise TokenizerError(f"{d / CONFIG_FILE}: not a tokenizer config ({type(exc).__name__}: {exc})") from None
        try:
            template = (d / TEMPLATE_FILE).read_bytes().decode("utf-8") if (d / TEMPLATE_FILE).is_file() else None
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{d / TEMPLATE_FILE}: not readable text ({exc})") from None
        try:
            hf = HFTokenizer.from_file(str(d / TOKENIZER_FILE))
        except Exception as exc:  # the tokenizers library raises its own Exception on a damaged file
            raise TokenizerError(f"{d / TOKENIZER_FILE}: not a tokenizers file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        if not max(bos, eos) < hf.get_vocab_size(with_added_tokens=True):
            raise TokenizerError(f"{d / CONFIG_FILE}: bos/eos {bos}/{eos} outside the vocabulary of {hf.get_vocab_size(with_added_tokens=True)}")
        return cls(hf, bos=bos, eos=eos, chat_template=template)

    # -- use -----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in it map to their ids."""
        return _encode_releasing_the_gil(self._hf, text)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD); the inverse of :meth:`encode`."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise TokenizerError(f"decode: token {i} outside 0..{self.vocab_size - 1}")
            if not (skip_special and i in self.special_ids):
                out.append(self._token_bytes[i])
        return b"".join(out).decode("utf-8", errors="replace")

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        """A fresh :class:`StreamDecoder` for one lane's output."""
        return StreamDecoder(self._token_bytes, self.special_ids, skip_special)

    def token_bytes(self, token: int) -> bytes:
        return self._token_bytes[int(token)]

    def apply_chat_template(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for ``messages`` (``[{"role": ..., "content": ...}]``) under
        the model's Jinja chat template (``tokenizer.chat_template``), rendered the way
        HF transformers does (sandboxed, ``trim_blocks``, ``lstrip_blocks``), within
        :data:`TEMPLATE_DEADLINE_S` and :data:`TEMPLATE_MAX_CHARS`.

        The text holds the contents as they are: encode it with :meth:`encode_chat`,
        not :meth:`encode`, when the contents are not yours."""
        check_messages(messages)
        return self._render(messages, add_generation_prompt, extra)

    def encode_chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """Token ids of ``messages`` in the chat template, every content encoded
        as text: control tokens come only from the template itself.

        The template is rendered once with the contents and once with a marker
        in place of each; when the contents appear verbatim where the markers
        did, the template's text is encoded with control tokens and the contents
        without (the text between two control tokens is encoded as one piece, as
        :meth:`encode` does, so ordinary contents give the same ids). A template
        that rewrites contents is refused only when a content holds the text of
        a control token."""
        check_messages(messages)
        text = self._render(messages, add_generation_prompt, extra)
        nonce = secrets.token_hex(8)
        marks = [f"\ue000sf_trt:{nonce}:{i}\ue001" for i in range(len(messages))]
        marked = self._render([{**m, "content": mark} for m, mark in zip(messages, marks)], add_generation_prompt, extra)
        parts = re.split(f"\ue000sf_trt:{nonce}:(\\d+)\ue001", marked)  # template, index, template, index, ...
        contents = [messages[int(i)]["content"] for i in parts[1::2]]
        if "".join(p if k % 2 == 0 else contents[k // 2] for k, p in enumerate(parts)) != text:
            for i, m in enumerate(messages):
                found = self._special_in(m["content"])
                if found:
                    raise TokenizerError(
                        f"encode_chat: message {i}'s content holds the control token text {found!r}, and this chat "
                        "template rewrites contents, so it cannot be kept as text"
                    )
            return self.encode(text)
        # [(is_content, text)], adjacent pieces of the same kind merged into one
        pieces: list[tuple[bool, str]] = []
        for k, p in enumerate(parts):
            pieces.append((k % 2 == 1, contents[k // 2] if k % 2 else p))
        ids: list[int] = []
        run: list[str] = []  # text since the last control token of the template
        for is_content, piece in pieces:
            if is_content:
                run.append(piece)
                continue
            for j, chunk in enumerate(self._special_split(piece)):
                if j % 2 == 1:  # a control token of the template
                    ids += self._encode_text("".join(run))
                    run = []
                    ids.append(self._special_ids_by_text[chunk])
                else:
                    run.append(chunk)
        ids += self._encode_text("".join(run))
        return ids

    # -- chat internals -----------------------------------------------------------------

    @property
    def _special_ids_by_text(self) -> dict[str, int]:
        if self._special_table is None:
            table = {self._hf.id_to_token(i): i for i in self.special_ids}
            self._special_table = {t: i for t, i in table.items() if t}
        return self._special_table

    def _special_split(self, text: str) -> list[str]:
        """``text`` split around control-token texts: [text, control, text, ...]
        (leftmost, longest first, as the tokenizer matches them)."""
        if self._special_re is None:
            names = sorted(self._special_ids_by_text, key=len, reverse=True)
            self._special_re = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else re.compile("(?!)")
        return self._special_re.split(text)

    def _special_in(self, text: str) -> str | None:
        parts = self._special_split(text)
        return parts[1] if len(parts) > 1 else None

    def _encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` with no control token matched (they stay characters)."""
        if not text:
            return []
        if self._hf_text is None:
            from tokenizers import Tokenizer as HFTokenizer

            hf = HFTokenizer.from_str(self._hf.to_str())
            hf.encode_special_tokens = True
            self._hf_text = hf
        return _encode_releasing_the_gil(self._hf_text, text)

    def _render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool, extra: dict[str, Any]) -> str:
        if not self.chat_template:
            raise TokenizerError("apply_chat_template: this model has no chat template (tokenizer.chat_template)")
        if self._template_failure is not None:
            raise TokenizerError(self._template_failure)
        if self._compiled_template is None:
            self._compiled_template = compile_template(self.chat_template)
        kwargs = dict(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=self._hf.id_to_token(self.bos), eos_token=self._hf.id_to_token(self.eos), **extra,
        )
        try:
            return render_bounded(self._compiled_template, kwargs)
        except TemplateTimeout:
            self._template_failure = (
                f"chat template: did not finish rendering within {TEMPLATE_DEADLINE_S:g}s (a loop that runs too long?); "
                "it is not run again"
            )
            raise TokenizerError(self._template_failure) from None


def _encode_releasing_the_gil(hf: Any, text: str) -> list[int]:
    """``hf.encode(text)``'s ids. ``encode_batch`` gives the same ids but releases the GIL
    while it works (``encode`` holds it): a server tokenizing a long prompt in a worker
    thread keeps answering other clients (2 MiB of text: its event loop stalled 3.7 s
    with ``encode``, 0.2 s with this)."""
    return list(hf.encode_batch([text], add_special_tokens=False)[0].ids)
