"""The model's tokenizer, with the ``tokenizers`` library.

A GGUF ``gpt2``-model vocabulary is byte-level BPE: ``tokenizer.ggml.tokens`` are
the byte-level strings (GPT-2's byte-to-unicode alphabet), ``tokenizer.ggml.merges``
the merge ranks, and ``tokenizer.ggml.token_type`` marks control tokens
(``<|im_start|>`` ...), which are added as special tokens so that text produced by
the chat template encodes them as one id each. The pre-tokenizer follows
``tokenizer.ggml.pre``: for ``smollm`` (SmolLM / SmolLM2) llama.cpp splits every
digit on its own and then applies the GPT-2 regex, which is HF's
``Sequence([Digits(individual_digits=True), ByteLevel(add_prefix_space=False)])``.

Decoding maps each id to its bytes and decodes UTF-8 (invalid sequences become
U+FFFD), so :meth:`Tokenizer.decode` and the incremental :class:`StreamDecoder`
agree by construction, including multi-byte characters split over tokens.

Saved as ``tokenizer.json`` (the ``tokenizers`` file) + ``tokenizer_config.json``
(bos/eos) + ``chat_template.jinja`` in a model directory; :meth:`Tokenizer.load`
reads them back.
"""

from __future__ import annotations

import codecs
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["Tokenizer", "StreamDecoder", "TokenizerError"]

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types

# Pre-tokenizers by ``tokenizer.ggml.pre`` (llama.cpp's names) that we know how to build.
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_GPT2 = {"gpt2", "default", "mpt", "olmo", "jais"}


class TokenizerError(ValueError):
    """A tokenizer that cannot be built or used; the message says what was found."""


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _pre_tokenizer(pre: str):
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2:
        return byte_level
    raise TokenizerError(
        f"tokenizer.ggml.pre {pre!r} is not supported (known: {sorted(_DIGITS_THEN_GPT2 | _GPT2)})"
    )


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


class Tokenizer:
    """Byte-level BPE tokenizer with the model's special tokens and chat template.

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
        alphabet = {ch: b for b, ch in _byte_alphabet().items()}
        added = hf.get_added_tokens_decoder()  # id -> AddedToken
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        token_bytes: list[bytes] = []
        for i in range(self.vocab_size):
            piece = hf.id_to_token(i)
            if piece is None:
                token_bytes.append(b"")
            elif i in added:
                token_bytes.append(piece.encode("utf-8"))
            else:
                try:
                    token_bytes.append(bytes(alphabet[ch] for ch in piece))
                except KeyError:  # not a byte-level piece: keep its text
                    token_bytes.append(piece.encode("utf-8"))
        self._token_bytes = token_bytes
        self._compiled_template = None

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
        from tokenizers import AddedToken, decoders, models
        from tokenizers import Tokenizer as HFTokenizer

        if not tokens or merges is None:
            raise TokenizerError("no vocabulary or merges (expected tokenizer.ggml.tokens / tokenizer.ggml.merges)")
        types = token_types if token_types is not None else [1] * len(tokens)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        hf.pre_tokenizer = _pre_tokenizer(pre)
        hf.decoder = decoders.ByteLevel()
        added = [
            AddedToken(tok, special=(t == _CONTROL), normalized=False)
            for tok, t in zip(tokens, types)
            if t in (_CONTROL, _USER_DEFINED)
        ]
        hf.add_tokens(added)  # existing vocabulary entries keep their ids
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
        meta = json.loads((d / CONFIG_FILE).read_text())
        template = (d / TEMPLATE_FILE).read_text() if (d / TEMPLATE_FILE).is_file() else None
        return cls(HFTokenizer.from_file(str(d / TOKENIZER_FILE)), bos=meta["bos_token_id"], eos=meta["eos_token_id"], chat_template=template)

    # -- use -----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in it map to their ids."""
        return list(self._hf.encode(text, add_special_tokens=False).ids)

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
        HF transformers does (sandboxed, ``trim_blocks``, ``lstrip_blocks``)."""
        if not self.chat_template:
            raise TokenizerError("apply_chat_template: this model has no chat template (tokenizer.chat_template)")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TokenizerError(f"apply_chat_template: message {i} must be a dict with str 'role' and 'content' (got {m!r})")
        if self._compiled_template is None:
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError:
                raise TokenizerError("apply_chat_template needs jinja2 (pip install jinja2)") from None

            def raise_exception(message: str):
                raise TokenizerError(f"chat template: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._compiled_template = env.from_string(self.chat_template)
        return self._compiled_template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self._hf.id_to_token(self.bos),
            eos_token=self._hf.id_to_token(self.eos),
            **extra,
        )
