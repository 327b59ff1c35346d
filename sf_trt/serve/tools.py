"""Tools on the chat route: ``tools``, ``tool_choice``, tool-role messages and assistant
``tool_calls`` in the history.

A chat template with tool support (one that reads ``tools``) gets the tools and the
history the transformers way (``tools=``, assistant ``tool_calls`` with their arguments
as objects, ``tool`` messages), and the model answers in its family's call format
(:func:`tool_family` reads it from the template's source):

- ``hermes`` (Hermes, Qwen): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks;
- ``llama3`` (Llama 3.1/3.2): the message is ``{"name": ..., "parameters": {...}}``,
  optionally after ``<|python_tag|>``, several calls separated by ``;``;
- ``mistral`` (v0.3): ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``mistral_args`` (v11+ templates, which write ``[ARGS]``): ``[TOOL_CALLS]name[ARGS]{...}``
  per call (``[CALL_ID]id`` before ``[ARGS]`` is accepted).

Calls are parsed into ``tool_calls`` under ``auto`` (the markers are optional: a
tokenizer that decodes them as special tokens drops them from the text) and forced by
the grammar, in the family's own syntax, under ``required`` or a named function
(:meth:`ToolPlan.grammar`).

sf_trt's default model's chat template (SmolLM2's, and the fake's) has no tool support,
so the documented fallback applies (docs/serving.md, "Tools"):

- the tools' schemas go into the prompt: a system message lists them and says how to
  call one (a JSON object ``{"name": ..., "arguments": {...}}``), merged into the
  conversation's own system message when it has one;
- ``tool_choice`` ``required`` or a named function: the grammar forces exactly one call,
  a JSON object whose ``name`` is one of the allowed functions and whose ``arguments``
  match that function's ``parameters`` schema, so the call always parses and validates;
  it comes back as ``message.tool_calls`` with ``finish_reason: "tool_calls"``;
- ``none`` (and no ``tool_choice`` with no tools): the tools are not rendered;
  ``auto`` (the default when tools are given) is a 400: deciding whether to call needs a
  template that was trained for it;
- history: an assistant message's ``tool_calls`` are rendered as the JSON objects the
  model would have written; a ``tool`` message keeps its role and content.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import string
from typing import Any, Optional

from .errors import ApiError

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "TOOL_FAMILIES", "ToolCall", "ToolPlan", "tool_plan", "chat_messages", "parse_calls",
           "has_tool_support", "tool_family"]


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The Hermes/Qwen call tags."""
PYTHON_TAG = "<|python_tag|>"
"""Llama 3's marker before a call."""
MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
"""Mistral's call markers."""
TOOL_FAMILIES = ("hermes", "llama3", "mistral", "mistral_args")
"""The call formats of templates with tool support (module docstring)."""


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """What a request's tools do. ``call_schema``: the call a ``required`` or named
    ``tool_choice`` forces (None under ``auto``); ``native``: the template renders the
    tools itself (``tools``: what it is given) and calls come in ``family``'s format
    (:data:`TOOL_FAMILIES`); else ``system_text`` lists the tools (the fallback)."""

    call_schema: Optional[dict]
    native: bool
    tools: tuple = ()
    system_text: str = ""
    family: str = "hermes"

    def grammar(self) -> Optional[tuple[str, Any]]:
        """``(kind, source)`` of the forced call's grammar, in the family's syntax, or None under ``auto``."""
        if self.call_schema is None:
            return None
        if not self.native or self.family == "llama3":  # the call is the whole message: a JSON object
            return "json_schema", self.call_schema
        if self.family == "mistral_args":  # [TOOL_CALLS]name[ARGS]{arguments}, one rule per allowed function
            calls = self.call_schema.get("anyOf", [self.call_schema])
            rules = [f"f{i}: {json.dumps(c['properties']['name']['const'] + MISTRAL_ARGS)} a{i}\na{i}: %json {json.dumps(_compact(c['properties']['arguments']))}"
                     for i, c in enumerate(calls)]
            return "lark", f"start: {json.dumps(MISTRAL_CALLS)} ({' | '.join(f'f{i}' for i in range(len(calls)))})\n" + "\n".join(rules)
        open_, close = (f"{MISTRAL_CALLS}[", "]") if self.family == "mistral" else (f"{TOOL_CALL_OPEN}\n", f"\n{TOOL_CALL_CLOSE}")
        return "lark", f"start: {json.dumps(open_)} call {json.dumps(close)}\ncall: %json " + json.dumps(_compact(self.call_schema))


def _compact(schema: dict) -> dict:
    return {**schema, "x-guidance": {"whitespace_flexible": False}}  # as sf_trt.grammar's JSON


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments as JSON text (OpenAI's form)."""
    id: str = dataclasses.field(default_factory=lambda: f"call_{secrets.token_hex(12)}")

    def as_json(self, index: Optional[int] = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _functions(tools: list[Any]) -> dict[str, dict]:
    """name -> function object, each checked (``{"type": "function", "function": {"name", "parameters"?}}``)."""
    out = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{i}]: expected {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}} (got {str(tool)[:80]!r})", "tools")
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise _bad(f"tools[{i}].function.parameters: must be a JSON schema object (got {type(params).__name__})", "tools")
        if name in out:
            raise _bad(f"tools: the function name {name!r} occurs twice", "tools")
        out[name] = {"name": name, "description": fn.get("description", ""), "parameters": params}
    return out


def tool_plan(tools: Optional[list[Any]], tool_choice: Any, family: Optional[str]) -> Optional[ToolPlan]:
    """The request's plan for its tools, or None when they play no part (no tools, or
    ``tool_choice: "none"``); a 400 for what cannot be honoured. ``family``: the chat
    template's call format (:func:`tool_family`), None when it has no tool support."""
    native = family is not None
    if tool_choice is not None and not tools and tool_choice != "none":
        raise _bad(f"tool_choice {str(tool_choice)[:60]!r} needs tools", "tool_choice")
    if not tools or tool_choice == "none":
        return None
    functions = _functions(tools)
    if (tool_choice is None or tool_choice == "auto") and native:
        return ToolPlan(None, True, tuple(tools), family=family)
    if tool_choice is None or tool_choice == "auto":
        raise _bad("tool_choice: 'auto' needs a chat template with tool support, which this model's has not; "
                   "use 'required' or name a function (the grammar then forces a call), or 'none'", "tool_choice")
    if tool_choice == "required":
        allowed = list(functions)
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name not in functions:
            raise _bad(f"tool_choice: function {name!r} is not among the tools ({', '.join(functions)})", "tool_choice")
        allowed = [name]
    else:
        raise _bad(f"tool_choice: expected 'none', 'auto', 'required' or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} "
                   f"(got {str(tool_choice)[:60]!r})", "tool_choice")
    key = "parameters" if family == "llama3" else "arguments"
    calls = [{"type": "object", "properties": {"name": {"const": n}, key: functions[n]["parameters"]},
              "required": ["name", key], "additionalProperties": False} for n in allowed]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if native:
        return ToolPlan(schema, True, tuple(tools), family=family)
    listed = "\n".join(json.dumps(functions[n]) for n in functions)
    text = ("You can call these functions:\n" + listed + "\n\nCall "
            + ("one of them" if len(allowed) > 1 else f"the function {allowed[0]}")
            + ' now: answer with only a JSON object {"name": <function name>, "arguments": <its arguments>}.')
    return ToolPlan(schema, False, system_text=text)


def _call_text(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad(f"{where}: expected {{\"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": \"...\"}}}}", "messages")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        raise _bad(f"{where}.function.arguments: not JSON ({str(args)[:60]!r})", "messages") from None
    return json.dumps({"name": fn["name"], "arguments": parsed}, separators=(",", ":"))


def _native_call(call: Any, where: str) -> dict:
    """A history call the transformers way: ``{"type": "function", "function": {"name",
    "arguments": <an object>}}`` (templates write ``arguments | tojson``)."""
    obj = json.loads(_call_text(call, where))
    out = {"type": "function", "function": {"name": obj["name"], "arguments": obj["arguments"]}}
    return {"id": call["id"], **out} if isinstance(call.get("id"), str) else out  # Mistral's templates read the id


def chat_messages(messages: list[Any], plan: Optional[ToolPlan], native: bool) -> list[dict]:
    """The conversation as the template's messages (module docstring): ``{"role",
    "content"}``, plus ``tool_calls`` / ``tool_call_id`` for a template with tool support."""
    out = []
    for i, m in enumerate(messages):
        content = m.text()
        if native:
            msg = {"role": m.role, "content": content}
            if m.tool_calls:
                msg["tool_calls"] = [_native_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)]
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            out.append(msg)
            continue
        if m.role == "assistant" and m.tool_calls:
            content = "\n".join([content] * bool(content) + [_call_text(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)])
        out.append({"role": m.role, "content": content})
    if plan is not None and not plan.native:
        if out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": out[0]["content"] + "\n\n" + plan.system_text}
        else:
            out.insert(0, {"role": "system", "content": plan.system_text})
    return out


def _call_of(obj: Any, key: str = "arguments") -> Optional[ToolCall]:
    """The call a parsed JSON object holds (``{"name": ..., key: ...}``), or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or key not in obj:
        return None
    return ToolCall(obj["name"], json.dumps(obj[key], separators=(",", ":")))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


_DECODER = json.JSONDecoder()


def _json_prefix(text: str, at: int) -> tuple[Any, int]:
    """The JSON value at ``text[at:]`` (after whitespace) and the index after it; ``(None, at)`` if none."""
    at = len(text) - len(text[at:].lstrip())
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        return None, at


def _hermes_calls(text: str) -> Optional[tuple[str, list[ToolCall]]]:
    first = text.find(TOOL_CALL_OPEN)
    if first < 0:
        return None
    calls = []
    for block in text[first:].split(TOOL_CALL_OPEN)[1:]:
        body, sep, rest = block.partition(TOOL_CALL_CLOSE)
        call = _call_of(_json(body.strip())) if sep else None
        if call is None or rest.strip():
            return None
        calls.append(call)
    return text[:first].strip(), calls


def _llama3_calls(text: str) -> Optional[tuple[str, list[ToolCall]]]:
    """``[content <|python_tag|>]{"name", "parameters"}[; {...}]...``: every object after
    the tag (or the whole message, without one) must be a call."""
    content, tag, body = text.partition(PYTHON_TAG)
    if not tag:
        content, body = "", text
    calls, at = [], 0
    while True:
        obj, at = _json_prefix(body, at)
        call = _call_of(obj, "parameters") or _call_of(obj, "arguments")
        if call is None:
            return None
        calls.append(call)
        rest = body[at:].lstrip()
        if not rest:
            return content.strip(), calls
        if not rest.startswith(";"):
            return None
        at = len(body) - len(rest) + 1


_NAME = re.compile(r"\s*([A-Za-z0-9_.:-]+)\s*(?:" + re.escape(MISTRAL_CALL_ID) + r"\s*[A-Za-z0-9_-]*\s*)?(?:" + re.escape(MISTRAL_ARGS) + ")?")


def _mistral_calls(text: str) -> Optional[tuple[str, list[ToolCall]]]:
    """``[content][TOOL_CALLS]`` then ``[{...}, ...]`` (v0.3) or ``name[ARGS]{...}`` per call
    (v11+, each after its own ``[TOOL_CALLS]``); markers optional (a decoder that skips
    special tokens drops them), every byte after the first must belong to a call."""
    content, tag, body = text.partition(MISTRAL_CALLS)
    if not tag:
        content, body = "", text
    if body.lstrip().startswith("["):
        obj, at = _json_prefix(body, 0)
        calls = [_call_of(o) for o in obj] if isinstance(obj, list) and obj and not body[at:].strip() else [None]
        return None if None in calls else (content.strip(), calls)
    calls, at = [], 0
    while at < len(body):
        name = _NAME.match(body, at)
        args, end = _json_prefix(body, name.end()) if name else (None, at)
        if not name or not isinstance(args, dict):
            return None
        calls.append(ToolCall(name.group(1), json.dumps(args, separators=(",", ":"))))
        rest = body[end:].lstrip()
        at = len(body) - len(rest) + (len(MISTRAL_CALLS) if rest.startswith(MISTRAL_CALLS) else 0)
    return (content.strip(), calls) if calls else None


_PARSERS = {"hermes": _hermes_calls, "llama3": _llama3_calls, "mistral": _mistral_calls, "mistral_args": _mistral_calls}


def parse_calls(text: str, plan: ToolPlan) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` of an output: the fallback's output is one JSON call; a native
    one holds calls in ``plan.family``'s format (module docstring; content: the text
    before the first). Output that does not parse as calls is all content, with no calls."""
    if not plan.native:
        call = _call_of(_json(text))
        return (text, []) if call is None else ("", [call])
    content, calls = _PARSERS[plan.family](text) or (text, [])
    if plan.family.startswith("mistral"):  # its templates want 9 letters and digits as a call's id
        calls = [dataclasses.replace(c, id="".join(secrets.choice(_ALNUM) for _ in range(9))) for c in calls]
    return content, calls


_ALNUM = string.ascii_letters + string.digits


def tool_family(tokenizer: Any) -> Optional[str]:
    """The call format (:data:`TOOL_FAMILIES`) of the tokenizer's chat template, read from
    its source, or None when it has no tool support (a Jinja template that reads ``tools``)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "tools" not in template:
        return None
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if MISTRAL_CALLS in template:
        return "mistral_args" if MISTRAL_ARGS in template else "mistral"
    if PYTHON_TAG in template or '"parameters"' in template:
        return "llama3"
    return "hermes"


def has_tool_support(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tools (a Jinja template reading ``tools``)."""
    return tool_family(tokenizer) is not None
