"""Tools on the chat route: ``tools``, ``tool_choice``, tool-role messages and assistant
``tool_calls`` in the history.

A chat template with tool support (one that reads ``tools``: Hermes, Qwen) gets the tools
and the history the transformers way (``tools=``, assistant ``tool_calls`` with their
arguments as objects, ``tool`` messages), and the model answers with Hermes-style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks: parsed into
``tool_calls`` under ``auto``, forced by the grammar under ``required`` or a named
function (:func:`call_grammar`).

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
import secrets
from typing import Any, Optional

from .errors import ApiError

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "ToolCall", "ToolPlan", "tool_plan", "chat_messages", "parse_calls", "has_tool_support"]


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The Hermes/Qwen call tags."""


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """What a request's tools do. ``call_schema``: the call a ``required`` or named
    ``tool_choice`` forces (None under ``auto``); ``native``: the template renders the
    tools itself (``tools``: what it is given) and calls come in ``<tool_call>`` tags;
    else ``system_text`` lists the tools (the fallback)."""

    call_schema: Optional[dict]
    native: bool
    tools: tuple = ()
    system_text: str = ""

    def grammar(self) -> Optional[tuple[str, Any]]:
        """``(kind, source)`` of the forced call's grammar, or None under ``auto``."""
        if self.call_schema is None:
            return None
        if not self.native:
            return "json_schema", self.call_schema
        compact = {**self.call_schema, "x-guidance": {"whitespace_flexible": False}}  # as sf_trt.grammar's JSON
        return "lark", (f'start: "{TOOL_CALL_OPEN}\\n" call "\\n{TOOL_CALL_CLOSE}"\ncall: %json ' + json.dumps(compact))


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


def tool_plan(tools: Optional[list[Any]], tool_choice: Any, native: bool) -> Optional[ToolPlan]:
    """The request's plan for its tools, or None when they play no part (no tools, or
    ``tool_choice: "none"``); a 400 for what cannot be honoured. ``native``: the chat
    template has tool support."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise _bad(f"tool_choice {str(tool_choice)[:60]!r} needs tools", "tool_choice")
    if not tools or tool_choice == "none":
        return None
    functions = _functions(tools)
    if (tool_choice is None or tool_choice == "auto") and native:
        return ToolPlan(None, True, tuple(tools))
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
    calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": functions[n]["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for n in allowed]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if native:
        return ToolPlan(schema, True, tuple(tools))
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
    return {"type": "function", "function": {"name": obj["name"], "arguments": obj["arguments"]}}


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


def _call_of(text: str) -> Optional[ToolCall]:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return ToolCall(obj["name"], json.dumps(obj["arguments"], separators=(",", ":")))


def parse_calls(text: str, plan: ToolPlan) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` of an output: the fallback's output is one JSON call; a native
    one holds ``<tool_call>`` blocks (content: the text before the first). A block that
    does not parse leaves the whole output as content, with no calls."""
    if not plan.native:
        call = _call_of(text)
        return (text, []) if call is None else ("", [call])
    first = text.find(TOOL_CALL_OPEN)
    if first < 0:
        return text, []
    calls = []
    for block in text[first:].split(TOOL_CALL_OPEN)[1:]:
        body, sep, rest = block.partition(TOOL_CALL_CLOSE)
        call = _call_of(body.strip()) if sep else None
        if call is None or rest.strip():
            return text, []
        calls.append(call)
    return text[:first].strip(), calls


def has_tool_support(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders tools (a Jinja template reading ``tools``)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template
