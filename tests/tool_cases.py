"""What the tool tests share: two tools with bounded arguments, a request through the
openai client (``tool_choice`` required by default, speculation chosen) and the check
that each choice is one call whose arguments validate."""

from __future__ import annotations

import json

import jsonschema

ASK = [{"role": "user", "content": 'Weather in Oslo for 3 days? {"name":"get_weather","arguments":{"city":"Oslo","days":3}}'}]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


def call(client, speculate: str, temperature: float, **kw):
    kw = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 200, "seed": 3, **kw}
    return client.chat.completions.create(model="fake", temperature=temperature, extra_body={"sf_trt": {"speculate": speculate}}, **kw)


def calls_of(response) -> list[tuple[str, str]]:
    out = []
    for c in response.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None and len(c.message.tool_calls) == 1
        fn = c.message.tool_calls[0].function
        jsonschema.validate(json.loads(fn.arguments), SCHEMAS[fn.name])
        out.append((fn.name, fn.arguments))
    return out
