"""Tools through the official openai client, on the fake server (whose byte chat template,
like SmolLM2's, has no tool support: the documented fallback, sf_trt/serve/tools.py).

``tool_choice`` ``required`` and named: the grammar forces one call, which always parses
into ``tool_calls`` with arguments that validate against the function's schema, the same
with speculation on and off, greedy and sampled, streamed as a delta; a history holding
assistant ``tool_calls`` and tool results is rendered; ``none`` ignores the tools;
``auto`` and malformed tools are 400s naming the field.
"""

from __future__ import annotations

import json

import openai
import pytest

from tool_cases import ASK, TOOLS, call, calls_of


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_required_forces_a_call_that_validates_and_speculation_keeps_it(client, temperature):
    plain = calls_of(call(client, "none", temperature, n=3))
    assert calls_of(call(client, "prompt-lookup", temperature, n=3)) == plain


@pytest.mark.parametrize("name", ["get_weather", "add"])
def test_a_named_tool_choice_calls_that_function(client, name):
    choice = {"type": "function", "function": {"name": name}}
    got = calls_of(call(client, "prompt-lookup", 0.9, tool_choice=choice, n=2))
    assert {n for n, _ in got} == {name}
    assert calls_of(call(client, "none", 0.9, tool_choice=choice, n=2)) == got


def test_a_streamed_call_comes_as_a_tool_call_delta_equal_to_the_whole_answer(client):
    (whole,) = calls_of(call(client, "prompt-lookup", 0.9))
    deltas, reasons = [], []
    for chunk in call(client, "prompt-lookup", 0.9, stream=True):
        for ch in chunk.choices:
            deltas += ch.delta.tool_calls or []
            assert not ch.delta.content
            reasons.append(ch.finish_reason)
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [(0, *whole)]
    assert deltas[0].id.startswith("call_") and reasons[-1] == "tool_calls"


def test_a_history_with_calls_and_tool_results_is_rendered_and_accepted(client):
    first = call(client, "none", 0.0).choices[0].message
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [tc.model_dump() for tc in first.tool_calls]},
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": '{"temperature": 21}'},
        {"role": "user", "content": "Now add 2 and 3."},
    ]
    r = call(client, "prompt-lookup", 0.0, messages=history, tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=60)
    assert calls_of(r)[0][0] == "add"
    assert r.usage.prompt_tokens > call(client, "none", 0.0).usage.prompt_tokens + len('{"temperature": 21}')
    plain = client.chat.completions.create(model="fake", messages=history, max_tokens=5, temperature=0, tools=TOOLS, tool_choice="none")
    assert plain.choices[0].message.tool_calls is None  # none: the tools play no part, the history is still rendered


def test_tool_choice_none_answers_as_without_tools(client):
    kw = dict(model="fake", messages=ASK, max_tokens=20, temperature=0)
    assert (client.chat.completions.create(**kw, tools=TOOLS, tool_choice="none").choices[0].message.content
            == client.chat.completions.create(**kw).choices[0].message.content)


@pytest.mark.parametrize("extra, param, words", [
    ({"tools": TOOLS}, "tool_choice", "'auto' needs a chat template with tool support"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", "'auto' needs"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope' is not among"),
    ({"tools": [{"type": "function", "function": {}}], "tool_choice": "required"}, "tools", "tools[0]"),
    ({"tools": TOOLS * 2, "tool_choice": "required"}, "tools", "occurs twice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "at most one"),
])
def test_tools_the_fallback_cannot_honour_are_a_400_naming_the_field(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="fake", messages=ASK, max_tokens=5, **extra)
    assert exc.value.body["param"] == param and words in exc.value.body["message"], exc.value.body


@pytest.mark.slow
def test_on_the_real_model_forced_calls_validate_and_speculation_keeps_them(real_model_dir, real_tokenizer):
    """SmolLM2 (no tool support in its template): the fallback's calls, required and named,
    greedy and sampled, parse and validate, the same with speculation on and off."""
    from servers import live_server

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    asks = ["What is the weather in Paris for the next 2 days?", "Please add 17 and 25.", "Is it raining in Lima this week?"]
    with OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=1024, threads=2) as prims, \
            live_server(prims, tokenizer=real_tokenizer) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        for i, ask in enumerate(asks):
            for temperature in (0.0, 0.8):
                choice = "required" if i != 1 else {"type": "function", "function": {"name": "add"}}
                kw = dict(messages=[{"role": "user", "content": ask}], tool_choice=choice, max_tokens=80, seed=i)
                got = calls_of(call(client, "prompt-lookup", temperature, **kw))
                assert calls_of(call(client, "none", temperature, **kw)) == got
                if i == 1:
                    assert got[0][0] == "add"


# -- a chat template with tool support (Hermes/Qwen style) ---------------------------------------------


class HermesBytes:
    """The fake's byte tokenizer under a Hermes-style chat template that reads ``tools``:
    the tools listed in a system turn, history calls as ``<tool_call>`` blocks."""

    def __new__(cls):
        from sf_trt.tokenizer import ByteTokenizer

        class _Hermes(ByteTokenizer):
            def __init__(self) -> None:
                super().__init__(257, 256)
                self.chat_template = "hermes-style test template: renders tools and tool_calls"

            def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None, **extra):
                text = "system: tools " + json.dumps([t["function"]["name"] for t in tools]) + "\n" if tools else ""
                for m in messages:
                    calls = "".join(f"<tool_call>{json.dumps(c['function'])}</tool_call>" for c in m.get("tool_calls", []))
                    text += f"{m['role']}: {m['content']}{calls}\n"
                return text + ("assistant:" if add_generation_prompt else "")

            def encode_chat(self, messages, *, add_generation_prompt=True, **extra):
                return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **extra))

        return _Hermes()


@pytest.fixture(scope="module")
def hermes():
    from servers import live_server

    with live_server(tokenizer=HermesBytes()) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=30, max_retries=0) as client:
        yield client


HERMES_ASK = [{"role": "user", "content": 'Add 1 and 2. <tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'}]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_template_with_tool_support_gets_tool_call_tags_forced_by_the_grammar(hermes, temperature):
    got = calls_of(call(hermes, "prompt-lookup", temperature, messages=HERMES_ASK, n=2))
    assert calls_of(call(hermes, "none", temperature, messages=HERMES_ASK, n=2)) == got
    stream = call(hermes, "prompt-lookup", temperature, messages=HERMES_ASK, stream=True)
    deltas = [d for ch in stream for c in ch.choices for d in (c.delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == got[:1]


def test_auto_on_a_template_with_tool_support_parses_what_the_model_writes(hermes):
    from sf_trt.serve.tools import ToolPlan, parse_calls

    r = hermes.chat.completions.create(model="fake", messages=HERMES_ASK, tools=TOOLS, max_tokens=120, temperature=0)
    m = r.choices[0].message
    plan = ToolPlan(None, True, tuple(TOOLS))
    raw = hermes.chat.completions.create(model="fake", messages=HERMES_ASK, tools=TOOLS, tool_choice="none", max_tokens=120,
                                         temperature=0).choices[0].message.content
    content, calls = parse_calls(raw, plan)  # tool_choice none renders no tools: the same prompt but the system turn
    assert r.choices[0].finish_reason in ("tool_calls", "stop", "length")
    if m.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls" and all(json.loads(t.function.arguments) is not None for t in m.tool_calls)
    text = 'Sure. <tool_call>\n{"name":"add","arguments":{"a":1}}\n</tool_call>\n<tool_call>{"name":"get_weather","arguments":{}}</tool_call>'
    content, calls = parse_calls(text, plan)
    assert content == "Sure." and [(c.name, c.arguments) for c in calls] == [("add", '{"a":1}'), ("get_weather", "{}")]
    for broken in ('<tool_call>{"name":"add"}</tool_call>', "<tool_call>{not json}</tool_call>", '<tool_call>{"name":"a","arguments":{}}'):
        assert parse_calls(broken, plan) == (broken, [])
    assert parse_calls("no call", plan) == ("no call", [])


def test_a_template_with_tool_support_renders_the_history_calls_and_results(hermes):
    history = HERMES_ASK + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                              "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    ]
    with_history = call(hermes, "none", 0.0, messages=history, max_tokens=80)
    calls_of(with_history)
    assert with_history.usage.prompt_tokens > call(hermes, "none", 0.0, messages=HERMES_ASK, max_tokens=80).usage.prompt_tokens + len(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')


QWEN_STYLE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions. <tools>\n{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}"
    "</tools>\nCall one as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
"""A Qwen/Hermes-style Jinja template (tools in a system turn, history calls in <tool_call> tags)."""


@pytest.mark.slow
def test_on_the_real_model_a_qwen_style_template_renders_tools_and_forced_calls_validate(real_model_dir, real_tokenizer):
    """SmolLM2's weights and tokenizer under a Jinja template with tool support: the real
    renderer is given ``tools=`` and the history's calls; forced calls come in
    ``<tool_call>`` tags, parse and validate, with speculation on and off."""
    from servers import live_server

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.tokenizer import Tokenizer

    tok = Tokenizer(real_tokenizer._hf, bos=real_tokenizer.bos, eos=real_tokenizer.eos, chat_template=QWEN_STYLE)
    history = [{"role": "user", "content": "Add 2 and 3."},
               {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
               {"role": "tool", "content": "5"}]
    text = tok.apply_chat_template(history, tools=TOOLS)
    call_text = text[text.index("<tool_call>\n{"):]  # the history's call, in the template's own JSON
    assert '"name": "get_weather"' in text and '"name": "add"' in call_text and '"arguments": {"a": 2, "b": 3}' in call_text
    with OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=1024, threads=2) as prims, \
            live_server(prims, tokenizer=tok) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        asks = [{"role": "user", "content": "What is the weather in Paris for the next 2 days?"}]
        for temperature in (0.0, 0.8):
            got = calls_of(call(client, "prompt-lookup", temperature, messages=asks, max_tokens=80))
            assert calls_of(call(client, "none", temperature, messages=asks, max_tokens=80)) == got
        chat_history = [{"role": "user", "content": "Add 2 and 3."},
                        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                                "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                        {"role": "user", "content": "And the weather in Oslo for 3 days?"}]
        calls_of(call(client, "prompt-lookup", 0.0, messages=chat_history, max_tokens=80))
        auto = client.chat.completions.create(model="fake", messages=asks, tools=TOOLS, max_tokens=60, temperature=0)
        assert auto.choices[0].finish_reason in ("tool_calls", "stop", "length")  # auto: whatever the model writes, parsed
