"""The Llama 3 JSON and Mistral ``[TOOL_CALLS]`` call formats (sf_trt/serve/tools.py).

The family is read from the chat template's source; under ``auto`` the output is parsed
in the family's format (literal strings here: well-formed, several calls, markers
dropped by a decoder that skips special tokens, malformed: all content, no crash);
under ``required`` and named ``tool_choice`` the grammar forces one call in the
family's own syntax. Through the official openai client, on the fake backend under a
small Jinja template in each family's style: forced calls parse and validate, the
same with speculation on and off, greedy and sampled, streamed as one delta; and (slow)
on the real model's weights and tokenizer under each template.
"""

from __future__ import annotations

import openai
import pytest

from sf_trt.grammar import LaneGrammar, compile_grammar, token_table
from sf_trt.serve.tools import ToolPlan, parse_calls, tool_family, tool_plan
from sf_trt.tokenizer import ByteTokenizer
from sf_trt.tokenizer.chat_template import compile_template, render_bounded

from tool_cases import TOOLS, call, calls_of

LLAMA3_STYLE = (
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    'Respond with a JSON for a function call in the format {"name": function name, "parameters": dictionary of argument name and its value}.\n'
    "{%- for t in tools %}\n{{ t.function.name }}{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n\n"
    "{%- if m.tool_calls %}<|python_tag|>{%- for c in m.tool_calls %}{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}"
    "{%- endfor %}<|eom_id|>{%- else %}{{ m.content }}<|eot_id|>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)
"""A Llama 3.1/3.2-style template (the tools by name only, to keep the fake's prompts short): tools in the system turn, calls as ``{"name", "parameters"}``."""

MISTRAL_STYLE = (
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | map(attribute='function') | map(attribute='name') | list | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "[INST]{{ m.content }}[/INST]{%- elif m.tool_calls %}{%- for c in m.tool_calls if c.id is not defined or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endfor %}[TOOL_CALLS]"
    "{{ m.tool_calls | map(attribute='function') | list | tojson }}</s>{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)
"""A Mistral v0.3-style template: ``[TOOL_CALLS][{"name", "arguments"}]``; like the real one it
refuses a history call whose id is not 9 characters."""

MISTRAL_ARGS_STYLE = (
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | map(attribute='function') | map(attribute='name') | list | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}{%- for c in m.tool_calls %}[TOOL_CALLS]{{ c.function.name }}[ARGS]{{ c.function.arguments | tojson }}{%- endfor %}</s>"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)
"""A Mistral v11+-style template: ``[TOOL_CALLS]name[ARGS]{arguments}`` per call."""

STYLES = {"llama3": LLAMA3_STYLE, "mistral": MISTRAL_STYLE, "mistral_args": MISTRAL_ARGS_STYLE}


class JinjaBytes(ByteTokenizer):
    """The fake's byte tokenizer under a Jinja chat template, rendered in sf_trt's sandbox."""

    def __init__(self, source: str) -> None:
        super().__init__(257, 256)
        self.chat_template = source
        self._compiled = compile_template(source)

    def apply_chat_template(self, messages, *, add_generation_prompt=True, **extra):
        return render_bounded(self._compiled, dict(messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **extra))


def test_the_family_is_read_from_the_template():
    assert {f: tool_family(JinjaBytes(s)) for f, s in STYLES.items()} == {f: f for f in STYLES}
    assert tool_family(JinjaBytes("{% if tools %}{{ tools | tojson }} in <tool_call> tags{% endif %}")) == "hermes"
    assert tool_family(ByteTokenizer()) is None  # no tools in the template: the fallback


def calls(text: str, family: str) -> tuple[str, list[tuple[str, str]]]:
    content, got = parse_calls(text, ToolPlan(None, True, tuple(TOOLS), family=family))
    return content, [(c.name, c.arguments) for c in got]


ADD, WEATHER = ("add", '{"a":1,"b":2}'), ("get_weather", '{"city":"Oslo","days":3}')


@pytest.mark.parametrize("family, text, want", [
    ("llama3", '{"name": "add", "parameters": {"a": 1, "b": 2}}', ("", [ADD])),
    ("llama3", '<|python_tag|>{"name":"add","parameters":{"a":1,"b":2}}; {"name":"get_weather","parameters":{"city":"Oslo","days":3}}',
     ("", [ADD, WEATHER])),
    ("llama3", 'Let me add. <|python_tag|>{"name":"add","arguments":{"a":1,"b":2}}', ("Let me add.", [ADD])),
    ("mistral", '[TOOL_CALLS][{"name":"add","arguments":{"a":1,"b":2}}, {"name":"get_weather","arguments":{"city":"Oslo","days":3}}]',
     ("", [ADD, WEATHER])),
    ("mistral", ' [{"name":"add","arguments":{"a":1,"b":2}}]', ("", [ADD])),  # [TOOL_CALLS] dropped as a special token
    ("mistral_args", 'Sure.[TOOL_CALLS]add[ARGS]{"a":1,"b":2}[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city":"Oslo","days":3}',
     ("Sure.", [ADD, WEATHER])),
    ("mistral_args", 'add{"a":1,"b":2}', ("", [ADD])),  # both markers dropped
    ("mistral_args", '[TOOL_CALLS][{"name":"add","arguments":{"a":1,"b":2}}]', ("", [ADD])),  # the older form still parses
])
def test_auto_parses_each_family_s_calls(family, text, want):
    assert calls(text, family) == want


@pytest.mark.parametrize("family", list(STYLES))
@pytest.mark.parametrize("text", [
    "The answer is 3.", "", "{", '{"name": "add"}', '{"name": "add", "parameters": {"a": 1}} and more', '{"a": 1}; {"b": 2}',
    "[TOOL_CALLS]", '[TOOL_CALLS][{"name":"add"}]', '[TOOL_CALLS][{"name":"add","arguments":{}}', "[TOOL_CALLS]add[ARGS]{oops}",
    '[TOOL_CALLS]add[ARGS]{"a":1} trailing', "[1, 2]", "Hello there", '<|python_tag|>{"name":"add","parameters":{}};',
])
def test_malformed_output_under_auto_is_all_content(family, text):
    assert calls(text, family) == (text, [])


@pytest.mark.parametrize("family, text", [
    ("llama3", '{"name":"add","parameters":{"a":1,"b":2}}'),
    ("mistral", '[TOOL_CALLS][{"name":"add","arguments":{"a":1,"b":2}}]'),
    ("mistral_args", '[TOOL_CALLS]add[ARGS]{"a":1,"b":2}'),
])
def test_the_forced_grammar_is_the_family_s_own_syntax(family, text):
    """The grammar of a named choice accepts the family's call and ends there; it refuses
    another family's syntax and another function."""
    tok = ByteTokenizer(257, 256)
    plan = tool_plan(TOOLS, {"type": "function", "function": {"name": "add"}}, family)
    grammar = compile_grammar(*plan.grammar(), token_table(tok, 257, 256))
    ids = tok.encode(text)
    assert LaneGrammar(grammar).valid_prefix(ids) == len(ids) and LaneGrammar(grammar).allowed(ids)[-1, tok.eos]
    assert calls(text, family) == ("", [ADD])
    for other in ('<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>',
                  text.replace("add", "get_weather"), text.replace('"b":2', '"b":200')):
        assert LaneGrammar(grammar).valid_prefix(tok.encode(other)) < len(other)


@pytest.fixture(scope="module", params=list(STYLES))
def family_client(request):
    from servers import live_server

    with live_server(tokenizer=JinjaBytes(STYLES[request.param])) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=30, max_retries=0) as client:
        yield request.param, client


ASK = [{"role": "user", "content": 'Add 1 and 2: {"name":"add","arguments":{"a":1,"b":2}}'}]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_in_each_family_validate_and_speculation_keeps_them(family_client, temperature, choice):
    family, client = family_client
    got = calls_of(call(client, "prompt-lookup", temperature, messages=ASK, tool_choice=choice, n=3))
    assert calls_of(call(client, "none", temperature, messages=ASK, tool_choice=choice, n=3)) == got
    if isinstance(choice, dict):
        assert {name for name, _ in got} == {"get_weather"}
    stream = call(client, "prompt-lookup", temperature, messages=ASK, tool_choice=choice, stream=True)
    chunks = [c for ch in stream for c in ch.choices]
    deltas = [d for c in chunks for d in (c.delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [(0, *got[0])]
    assert len(deltas[0].id) == 9 if family.startswith("mistral") else deltas[0].id.startswith("call_")
    assert not any(c.delta.content for c in chunks) and chunks[-1].finish_reason == "tool_calls"


def test_a_history_with_calls_is_rendered_in_the_family_s_syntax(family_client):
    family, client = family_client
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a1B2c3D4e", "type": "function", "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]},
        {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "3"}, {"role": "user", "content": "And Oslo's weather for 3 days?"}]
    text = JinjaBytes(STYLES[family]).apply_chat_template(
        [{**m, "tool_calls": [{"id": "a1B2c3D4e", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]} if m["role"] == "assistant" else m
         for m in history], tools=TOOLS)
    assert calls(text[text.index({"llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]", "mistral_args": "[TOOL_CALLS]"}[family]):]
                 .split("<|eom_id|>")[0].split("</s>")[0], family)[1] == [ADD]
    r = call(client, "prompt-lookup", 0.0, messages=history, max_tokens=120)
    assert r.usage.prompt_tokens == len(text.encode())
    assert calls_of(r) == calls_of(call(client, "none", 0.0, messages=history, max_tokens=120))
    if family == "mistral":  # the template reads the history's call ids
        history[1]["tool_calls"][0]["id"] = "call_1"
        with pytest.raises(openai.BadRequestError, match="length 9"):
            call(client, "none", 0.0, messages=history, max_tokens=120)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_auto_gives_what_the_parser_makes_of_the_raw_output_the_same_with_speculation(family_client, temperature):
    """Under ``auto`` the answer is the family parser's reading of what the model wrote
    (the raw text: the same prompt through /v1/completions), identical with speculation on
    and off; the fake's copy model writes no well-formed call, so it stays content."""
    family, client = family_client
    prompt = JinjaBytes(STYLES[family]).apply_chat_template(ASK, tools=TOOLS)
    kw = dict(model="fake", max_tokens=60, temperature=temperature, seed=5)
    raw = client.completions.create(prompt=prompt, **kw).choices[0].text
    answers = [client.chat.completions.create(messages=ASK, tools=TOOLS, tool_choice="auto", extra_body={"sf_trt": {"speculate": s}}, **kw)
               .choices[0].message for s in ("none", "prompt-lookup")]
    content, got = calls(raw, family)
    for m in answers:
        assert (m.content or "", [(t.function.name, t.function.arguments) for t in m.tool_calls or []]) == (content, got)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(STYLES))
def test_on_the_real_model_each_family_s_forced_calls_validate_and_speculation_keeps_them(real_model_dir, real_tokenizer, family):
    """SmolLM2's weights and tokenizer under each family's template: forced calls, required
    and named, greedy and sampled, parse and validate, the same with speculation on and off;
    ``auto`` answers whatever the model writes, parsed in the family's format."""
    from servers import live_server

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.tokenizer import Tokenizer

    tok = Tokenizer(real_tokenizer._hf, bos=real_tokenizer.bos, eos=real_tokenizer.eos, chat_template=STYLES[family])
    with OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=1024, threads=2) as prims, \
            live_server(prims, tokenizer=tok) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=300, max_retries=0) as client:
        asks = [{"role": "user", "content": "What is the weather in Paris for the next 2 days?"}]
        for temperature, choice in ((0.0, "required"), (0.8, {"type": "function", "function": {"name": "add"}})):
            got = calls_of(call(client, "prompt-lookup", temperature, messages=asks, tool_choice=choice, max_tokens=80))
            assert calls_of(call(client, "none", temperature, messages=asks, tool_choice=choice, max_tokens=80)) == got
        auto = client.chat.completions.create(model="fake", messages=asks, tools=TOOLS, max_tokens=60, temperature=0)
        assert auto.choices[0].finish_reason in ("tool_calls", "stop", "length")
