"""Grammars that constrain a lane's tokens: JSON schemas, regexes, choices, Lark grammars.

The engine is llguidance (the one llama.cpp and vLLM use): it works on token ids and the
tokenizer's bytes, needs no torch, and computes a token mask in tens of microseconds
(docs/design.md "Structured output" compares it with outlines-core and xgrammar).

- :func:`token_table` builds llguidance's view of a tokenizer (each id's bytes, its special
  ids, the model's end token) from any sf_trt tokenizer: the model's byte-level BPE or the
  fake's bytes.
- :func:`compile_grammar` turns a request's constraint into a :class:`Grammar`, checked: a
  constraint the engine cannot compile raises :class:`GrammarError` naming it.
- :class:`LaneGrammar` is one lane's matcher. Its state is the lane's committed tokens
  (:meth:`LaneGrammar.extend`); :meth:`LaneGrammar.allowed` gives the mask of each row of a
  step, row ``i`` being the state after ``draft[:i]`` (advanced on the matcher and rolled
  back, so the lane's state is untouched), and :meth:`LaneGrammar.valid_prefix` how much of
  a draft the grammar allows (the rest is cut before the pass). The end token is allowed
  only where the grammar accepts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import numpy as np

__all__ = ["GRAMMAR_KINDS", "Grammar", "GrammarError", "LaneGrammar", "compile_grammar", "token_table"]

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "choice", "lark")
"""What :func:`compile_grammar` takes: a JSON schema (a dict or its text), any JSON object,
a regex, a list of strings, or a Lark grammar (llguidance's dialect; GBNF is converted)."""


_COMPACT = {"whitespace_flexible": False}
"""JSON without free whitespace (``{"a":1,"b":[2]}``): valid JSON, and a small model cannot
run away in blank lines inside an object (llguidance's flexible default allows any)."""


class GrammarError(ValueError):
    """A constraint the engine cannot compile; the message names the kind and the reason."""


def _llguidance():
    try:
        import llguidance  # lazy: a process without structured requests never loads it
    except ImportError:
        raise GrammarError("structured output needs llguidance: pip install 'sf_trt[serve]' (or llguidance)") from None

    return llguidance


class _Wrapped:
    """The fields llguidance's ``TokenizerWrapper`` reads, from an sf_trt tokenizer."""

    def __init__(self, tokenizer: Any, vocab: int, eos: int) -> None:
        self.eos_token_id = eos
        self.bos_token_id = None
        self.tokens = [tokenizer.token_bytes(i) if i < tokenizer.vocab_size else b"" for i in range(vocab)]
        self.special_token_ids = sorted(int(i) for i in tokenizer.special_ids if i < vocab)
        self._tokenizer = tokenizer

    def __call__(self, text: Any) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


def token_table(tokenizer: Any, vocab: int, eos: int) -> Any:
    """llguidance's ``LLTokenizer`` for ``tokenizer`` (``token_bytes``, ``special_ids``,
    ``encode``: :class:`sf_trt.tokenizer.Tokenizer` or :class:`~sf_trt.tokenizer.ByteTokenizer`)
    over the model's ``vocab`` ids, ``eos`` its end token. Costs about a second for a 49k
    vocabulary: build it once per tokenizer."""
    llg = _llguidance()
    return llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped(tokenizer, int(vocab), int(eos))), n_vocab=int(vocab), eos_token=int(eos))


@dataclasses.dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled constraint: ``kind`` (one of :data:`GRAMMAR_KINDS`), the ``source`` the
    request gave, and llguidance's grammar and token table. Compared by identity."""

    kind: str
    source: Any
    text: str = dataclasses.field(repr=False)
    table: Any = dataclasses.field(repr=False)

    @property
    def vocab(self) -> int:
        return int(self.table.vocab_size)

    @property
    def eos(self) -> int:
        return int(self.table.eos_token)


def _grammar_text(kind: str, source: Any) -> str:
    llg = _llguidance()
    M = llg.LLMatcher
    if kind == "json_schema":
        schema = json.loads(source) if isinstance(source, str) else source
        if not isinstance(schema, dict):
            raise GrammarError(f"json_schema: the schema must be a JSON object (got {type(schema).__name__})")
        return M.grammar_from_json_schema(schema, overrides=_COMPACT)
    if kind == "json_object":
        return M.grammar_from_json_schema({"type": "object"}, overrides=_COMPACT)
    if kind == "regex":
        if not isinstance(source, str):
            raise GrammarError(f"regex: must be a string (got {type(source).__name__})")
        return M.grammar_from_regex(source)
    if kind == "choice":
        if not isinstance(source, (list, tuple)) or not source or not all(isinstance(c, str) for c in source):
            raise GrammarError(f"choice: must be a non-empty list of strings (got {str(source)[:80]!r})")
        return llg.grammar_from("choice", list(source))
    if kind == "lark":
        if not isinstance(source, str):
            raise GrammarError(f"grammar: must be a string (got {type(source).__name__})")
        return llg.grammar_from("grammar", source)
    raise GrammarError(f"unknown grammar kind {kind!r} (expected one of {list(GRAMMAR_KINDS)})")


def compile_grammar(kind: str, source: Any, table: Any) -> Grammar:
    """Compile and check a constraint against ``table`` (:func:`token_table`); a
    :class:`GrammarError` naming ``kind`` and the engine's reason if it cannot be used."""
    try:
        text = _grammar_text(kind, source)
    except GrammarError:
        raise
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"{kind}: {str(exc).strip()[:400]}") from None
    error = _llguidance().LLMatcher.validate_grammar(text, table)
    if error:
        raise GrammarError(f"{kind}: the grammar engine cannot compile it: {error.strip()[:400]}")
    return Grammar(kind, source, text, table)


class LaneGrammar:
    """One lane's matcher (module docstring). Its state is the lane's emitted tokens."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        self.vocab = grammar.vocab
        self.matcher = _llguidance().LLMatcher(grammar.table, grammar.text, log_level=0)
        self.cut_tokens = 0
        """Draft tokens cut before a pass because the grammar forbids them (counted for tests and metrics)."""

    def extend(self, tokens: Sequence[int]) -> None:
        """The lane emitted ``tokens`` (each one the grammar allowed where it was drawn)."""
        self.matcher.consume_tokens([int(t) for t in tokens])

    def valid_prefix(self, draft: Sequence[int]) -> int:
        """How many of ``draft``'s first tokens the grammar allows, one after another."""
        if not draft:
            return 0
        n = int(self.matcher.validate_tokens([int(t) for t in draft]))
        self.cut_tokens += len(draft) - n
        return n

    def allowed(self, draft: Sequence[int]) -> np.ndarray:
        """bool ``[len(draft) + 1, vocab]``: row ``i`` the tokens allowed after ``draft[:i]``
        (``draft`` already cut to :meth:`valid_prefix`). The matcher ends where it began."""
        packed = []  # one bit per token, little-endian 32-bit words (llguidance may add a word)
        for i in range(len(draft) + 1):
            if i:
                self.matcher.consume_token(int(draft[i - 1]))
            packed.append(np.frombuffer(self.matcher.compute_bitmask(), np.uint8))
        if draft:
            self.matcher.rollback(len(draft))
        return np.unpackbits(np.stack(packed), axis=1, bitorder="little")[:, : self.vocab].astype(bool)
