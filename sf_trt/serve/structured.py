"""A request's output constraint: ``response_format`` and vLLM's ``structured_outputs`` /
``guided_*`` fields to one :class:`sf_trt.grammar.Grammar`, compiled and checked at the door.

=========================================================  ====================
field                                                      grammar kind
=========================================================  ====================
``response_format: {"type": "json_object"}``               ``json_object``
``response_format: {"type": "json_schema",                 ``json_schema``
"json_schema": {"name": ..., "schema": {...}}}``
``structured_outputs.json`` / ``guided_json``              ``json_schema``
``structured_outputs.regex`` / ``guided_regex``            ``regex``
``structured_outputs.choice`` / ``guided_choice``          ``choice``
``structured_outputs.grammar`` / ``guided_grammar``        ``lark`` (Lark or GBNF)
=========================================================  ====================

At most one constraint per request; one the engine cannot compile is a 400 naming the
field and the engine's reason.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from ..grammar import Grammar, GrammarError, compile_grammar, token_table
from .errors import ApiError
from .state import ServerState

__all__ = ["request_grammar"]

_STRUCTURED_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "lark"}


@functools.lru_cache(maxsize=4)
def _table(tokenizer: Any, vocab: int, eos: int) -> Any:
    return token_table(tokenizer, vocab, eos)


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


def _asked(body: Any) -> list[tuple[str, str, Any]]:
    """Every constraint the body asks for, as ``(param, kind, source)``."""
    asked = []
    rf = getattr(body, "response_format", None)
    if rf is not None:
        kind = rf.get("type") if isinstance(rf, dict) else None
        if kind == "json_object":
            asked.append(("response_format", "json_object", None))
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise _bad("response_format: json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}} "
                           f"(got {str(spec)[:80]!r})", "response_format")
            asked.append(("response_format", "json_schema", schema))
        elif kind != "text":
            raise _bad(f"response_format: type must be text, json_object or json_schema (got {kind!r})", "response_format")
    so = body.structured_outputs or {}
    for key, kind in _STRUCTURED_KINDS.items():
        if so.get(key) is not None:
            asked.append((f"structured_outputs.{key}", kind, so[key]))
        legacy = getattr(body, f"guided_{key}")
        if legacy is not None:
            asked.append((f"guided_{key}", kind, legacy))
    unknown = sorted(set(so) - set(_STRUCTURED_KINDS))
    if unknown:
        raise _bad(f"structured_outputs: unknown key(s) {unknown} (known: {sorted(_STRUCTURED_KINDS)})", "structured_outputs")
    return asked


def request_grammar(state: ServerState, body: Any, tool_grammar: Optional[tuple] = None) -> Optional[Grammar]:
    """The body's constraint compiled for the served model, or None; a 400 when the body
    asks for more than one, or for one that cannot be compiled. ``tool_grammar``: the
    ``(kind, source)`` of the call a ``tool_choice`` forces (:mod:`sf_trt.serve.tools`),
    one more constraint."""
    asked = _asked(body) + ([("tool_choice", *tool_grammar)] if tool_grammar is not None else [])
    if not asked:
        return None
    if len(asked) > 1:
        raise _bad(f"at most one output constraint per request (got {', '.join(p for p, _, _ in asked)})", asked[1][0])
    param, kind, source = asked[0]
    if body.ignores_eos:
        raise _bad(f"{param}: a constrained output ends where its grammar does; ignore_eos does not combine with it", param)
    caps = state.ready_engine().caps
    try:
        return compile_grammar(kind, source, _table(state.tokenizer, caps.vocab, caps.eos))
    except GrammarError as exc:
        raise _bad(f"{param}: {exc}", param) from None
