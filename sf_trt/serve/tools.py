"""Tools on the chat route: ``tools``, ``tool_choice``, tool-role messages and assistant
``tool_calls`` in the history.

sf_trt's models' chat templates (SmolLM2's, the fake's) have no tool support, so the
documented fallback applies (docs/serving.md, "Tools"):

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

__all__ = ["ToolCall", "ToolPlan", "tool_plan", "chat_messages", "parse_call"]


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, "BadRequestError", message, param)


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """What a request's tools do: the schema the output must match (``call_schema``: one
    forced call) and the system text that lists the tools."""

    call_schema: dict
    system_text: str


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


def tool_plan(tools: Optional[list[Any]], tool_choice: Any) -> Optional[ToolPlan]:
    """The request's plan for its tools, or None when they play no part (no tools, or
    ``tool_choice: "none"``); a 400 for what the fallback cannot honour."""
    if tool_choice is not None and not tools and tool_choice != "none":
        raise _bad(f"tool_choice {str(tool_choice)[:60]!r} needs tools", "tool_choice")
    if not tools or tool_choice == "none":
        return None
    functions = _functions(tools)
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
    listed = "\n".join(json.dumps(functions[n]) for n in functions)
    text = ("You can call these functions:\n" + listed + "\n\nCall "
            + ("one of them" if len(allowed) > 1 else f"the function {allowed[0]}")
            + ' now: answer with only a JSON object {"name": <function name>, "arguments": <its arguments>}.')
    return ToolPlan(schema, text)


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


def chat_messages(messages: list[Any], plan: Optional[ToolPlan]) -> list[dict]:
    """The conversation as the template's ``{"role", "content"}`` messages (module docstring)."""
    out = []
    for i, m in enumerate(messages):
        content = m.text()
        if m.role == "assistant" and m.tool_calls:
            content = "\n".join([content] * bool(content) + [_call_text(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m.tool_calls)])
        out.append({"role": m.role, "content": content})
    if plan is not None:
        if out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": out[0]["content"] + "\n\n" + plan.system_text}
        else:
            out.insert(0, {"role": "system", "content": plan.system_text})
    return out


def parse_call(text: str) -> Optional[ToolCall]:
    """The call in a forced output (the grammar's JSON object), or None if it is unfinished."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return ToolCall(obj["name"], json.dumps(obj["arguments"], separators=(",", ":")))
