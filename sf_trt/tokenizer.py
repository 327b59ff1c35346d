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

**Untrusted text stays text.** :meth:`Tokenizer.encode_chat` encodes the
template's own control tokens as control tokens and the messages' contents as
plain text: ``<|im_start|>system`` typed by a user is encoded as those
characters, never as the control token (a role forgery). Ordinary contents
encode exactly as ``encode(apply_chat_template(...))`` does. Chat templates
render in jinja2's immutable sandbox, in a worker thread with a deadline
(:data:`TEMPLATE_DEADLINE_S`) and a bound on every string they build and on
their output (:data:`TEMPLATE_MAX_CHARS`); a template that ran out of time is
refused from then on without running it again.

Saved as ``tokenizer.json`` (the ``tokenizers`` file) + ``tokenizer_config.json``
(bos/eos) + ``chat_template.jinja`` in a model directory; :meth:`Tokenizer.load`
reads them back.
"""

from __future__ import annotations

import codecs
import ctypes
import json
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["Tokenizer", "ByteTokenizer", "StreamDecoder", "TokenizerError", "TEMPLATE_DEADLINE_S", "TEMPLATE_MAX_CHARS"]

TEMPLATE_DEADLINE_S = 2.0
"""Seconds a chat template may take to render (SmolLM2's takes well under a millisecond)."""
TEMPLATE_MAX_CHARS = 8 << 20
"""The longest string a chat template may build or output, in characters."""

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
        pre_tokenizer = _pre_tokenizer(pre)
        try:
            hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
            hf.pre_tokenizer = pre_tokenizer
            hf.decoder = decoders.ByteLevel()
            added = [
                AddedToken(tok, special=(t == _CONTROL), normalized=False)
                for tok, t in zip(tokens, types)
                if t in (_CONTROL, _USER_DEFINED)
            ]
            hf.add_tokens(added)  # existing vocabulary entries keep their ids
        except Exception as exc:  # the tokenizers library raises its own Exception on a bad vocabulary
            raise TokenizerError(f"the tokenizers library refuses this vocabulary ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
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
        HF transformers does (sandboxed, ``trim_blocks``, ``lstrip_blocks``), within
        :data:`TEMPLATE_DEADLINE_S` and :data:`TEMPLATE_MAX_CHARS`.

        The text holds the contents as they are: encode it with :meth:`encode_chat`,
        not :meth:`encode`, when the contents are not yours."""
        _check_messages(messages)
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
        _check_messages(messages)
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
        return list(self._hf_text.encode(text, add_special_tokens=False).ids)

    def _render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool, extra: dict[str, Any]) -> str:
        if not self.chat_template:
            raise TokenizerError("apply_chat_template: this model has no chat template (tokenizer.chat_template)")
        if self._template_failure is not None:
            raise TokenizerError(self._template_failure)
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self.chat_template)
        kwargs = dict(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=self._hf.id_to_token(self.bos), eos_token=self._hf.id_to_token(self.eos), **extra,
        )
        try:
            return _render_bounded(self._compiled_template, kwargs)
        except _TemplateTimeout:
            self._template_failure = (
                f"chat template: did not finish rendering within {TEMPLATE_DEADLINE_S:g}s (a loop that runs too long?); "
                "it is not run again"
            )
            raise TokenizerError(self._template_failure) from None


def _check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise TokenizerError(f"apply_chat_template: messages must be a non-empty list of messages (got {type(messages).__name__})")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise TokenizerError(f"apply_chat_template: message {i} must be a dict with str 'role' and 'content' (got {m!r})")


# -- bounded template rendering -------------------------------------------------------------


class _TemplateTimeout(BaseException):
    """Raised inside the render thread at its deadline (BaseException: the template cannot catch it)."""


class _TemplateTooLarge(Exception):
    pass


def _check_size(n: int) -> None:
    if n > TEMPLATE_MAX_CHARS:
        raise _TemplateTooLarge(f"chat template: builds a value of {n} items, more than {TEMPLATE_MAX_CHARS}")


def _bounded(value: Any) -> Any:
    if isinstance(value, (str, list, tuple, bytes)):
        _check_size(len(value))
    return value


def _compile_template(source: str):
    try:
        from jinja2.compiler import CodeGenerator
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError("apply_chat_template needs jinja2 (pip install jinja2)") from None
    import jinja2

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame):  # ``a ~ b``: through bounded_join
            self.write("environment.bounded_join((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        """The immutable sandbox, with every ``+ * ** ~`` and call result bounded."""

        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset(["+", "*", "**", "%"])

        def bounded_join(self, parts):
            return _bounded("".join(str(p) for p in parts))

        def call_binop(self, context, operator, left, right):
            if operator == "*" and isinstance(right, int) and isinstance(left, (str, list, tuple)):
                _check_size(len(left) * right)
            if operator == "*" and isinstance(left, int) and isinstance(right, (str, list, tuple)):
                _check_size(len(right) * left)
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
                raise _TemplateTooLarge(f"chat template: exponent {right} is too large")
            return _bounded(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's own spelling)
            return _bounded(super().call(__context, __obj, *args, **kwargs))

    def raise_exception(message: str):
        raise TokenizerError(f"chat template: {message}")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise TokenizerError(f"chat template: does not compile ({type(exc).__name__}: {exc})") from None


def _render_bounded(template, kwargs: dict[str, Any]) -> str:
    """``template`` rendered in a worker thread: :class:`_TemplateTimeout` after
    :data:`TEMPLATE_DEADLINE_S` (the thread is stopped), TokenizerError for an
    error or a result over :data:`TEMPLATE_MAX_CHARS`."""
    import jinja2

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            out, size = [], 0
            for chunk in template.generate(**kwargs):
                size += len(chunk)
                if size > TEMPLATE_MAX_CHARS:
                    raise _TemplateTooLarge(f"chat template: output exceeds {TEMPLATE_MAX_CHARS} characters")
                out.append(chunk)
            box["text"] = "".join(out)
        except _TemplateTimeout:
            pass
        except (TokenizerError, _TemplateTooLarge) as exc:
            box["error"] = str(exc)
        except Exception as exc:  # the template is untrusted code: whatever it raises is its failure
            kind = "" if isinstance(exc, jinja2.TemplateError) else f"{type(exc).__name__}: "
            box["error"] = f"chat template: failed to render ({kind}{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"

    worker = threading.Thread(target=work, name="sf_trt-chat-template", daemon=True)
    worker.start()
    worker.join(TEMPLATE_DEADLINE_S)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(_TemplateTimeout))
        worker.join(0.5)
        raise _TemplateTimeout()
    if "error" in box:
        raise TokenizerError(box["error"])
    return box["text"]


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
        _check_messages(messages)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant:" if add_generation_prompt else "")

    def encode_chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """Ids of the chat text (bytes have no control tokens to forge)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra))
