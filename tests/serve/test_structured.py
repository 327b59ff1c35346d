"""Structured output through the official openai client, on the fake server (byte tokens).

``response_format`` (``json_schema`` strict, ``json_object``, and the client's ``.parse()``
with a pydantic model), vLLM's ``structured_outputs`` and ``guided_*`` on both routes:
every output parses and validates, streamed or not, and is the same with speculation on
and off, greedy and sampled, alone and among 16 concurrent requests; a constraint the
engine cannot compile is a 400 naming its field. LangChain's ``with_structured_output``
(by schema and by function calling) and litellm's JSON mode work too.
"""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pydantic
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        "coastal": {"type": "boolean"},
    },
    "required": ["city", "population", "coastal"],
    "additionalProperties": False,
}
EXAMPLE = 'Answer like {"city":"Oslo","population":7000,"coastal":true} or {"city":"Bern","population":1300,"coastal":false}.'
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}


def ask(client, speculate: str, temperature: float, seed: int = 1, **kw):
    kw = {"max_tokens": 200, **kw, "extra_body": {**kw.get("extra_body", {}), "sf_trt": {"speculate": speculate}}}
    return client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": EXAMPLE}], temperature=temperature, seed=seed, **kw)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_output_validates_and_is_the_same_with_speculation_on_and_off(client, temperature):
    outs = []
    for speculate in ("none", "prompt-lookup"):
        r = ask(client, speculate, temperature, n=3, response_format=RESPONSE_FORMAT)
        for c in r.choices:
            jsonschema.validate(json.loads(c.message.content), SCHEMA)
            assert c.finish_reason == "stop"
        outs.append([c.message.content for c in r.choices])
    assert outs[0] == outs[1]
    free = ask(client, "none", temperature, n=3)
    assert [c.message.content for c in free.choices] != outs[0], "the constraint changed nothing"


def test_a_streamed_constrained_answer_adds_up_to_the_whole_one(client):
    whole = ask(client, "prompt-lookup", 0.9, response_format=RESPONSE_FORMAT).choices[0].message.content
    stream = ask(client, "prompt-lookup", 0.9, response_format=RESPONSE_FORMAT, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == whole


def test_the_clients_parse_fills_a_pydantic_model(client):
    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=10)
        coastal: bool

    r = client.chat.completions.parse(model="fake", messages=[{"role": "user", "content": EXAMPLE}], response_format=City,
                                      max_tokens=200, temperature=0.5, seed=2)
    assert isinstance(r.choices[0].message.parsed, City)


def test_json_object_gives_an_object(client):
    """The copy model, given ``{}`` to copy, closes the object at once; the grammar then allows only EOS."""
    r = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "{} {} {}"}], max_tokens=50,
                                       temperature=0, response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {} and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("field, value, check", [
    ("guided_regex", r"[A-Z][a-z]{2,6}-[0-9]{2}", lambda t: re.fullmatch(r"[A-Z][a-z]{2,6}-[0-9]{2}", t)),
    ("guided_choice", ["Oslo", "Bern", "Lima"], lambda t: t in ("Oslo", "Bern", "Lima")),
    ("guided_json", SCHEMA, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ("guided_grammar", 'start: "(" NUM ")"\nNUM: /[0-9]{1,3}/', lambda t: re.fullmatch(r"\(\d{1,3}\)", t)),
    ("structured_outputs", {"regex": r"(yes|no)!"}, lambda t: t in ("yes!", "no!")),
    ("structured_outputs", {"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_vllms_fields_constrain_completions_and_speculation_keeps_them(client, field, value, check, temperature):
    texts = []
    for speculate in ("none", "prompt-lookup"):
        r = client.completions.create(model="fake", prompt=EXAMPLE + " Oslo-12 (12) yes! Bern-99 ", max_tokens=200,
                                      temperature=temperature, seed=5, n=2,
                                      extra_body={field: value, "sf_trt": {"speculate": speculate}})
        texts.append([c.text for c in r.choices])
        assert all(check(t) for t in texts[-1]), texts[-1]
    assert texts[0] == texts[1]


def test_sixteen_concurrent_constrained_requests_each_answer_what_they_answer_alone(fake_server):
    bodies = []
    for i in range(16):
        body = {"model": "fake", "messages": [{"role": "user", "content": EXAMPLE + " " * (i % 3)}], "max_tokens": 200,
                "temperature": (0.0, 0.9)[i % 2], "seed": i}
        if i % 4 != 3:  # a quarter unconstrained, sharing passes with the rest
            body["response_format"] = RESPONSE_FORMAT
        bodies.append(body)

    async def run(speculate: str, together: bool) -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{fake_server.url}/v1", api_key="unused", max_retries=0) as c:
            async def one(b):
                r = await c.chat.completions.create(**b, extra_body={"sf_trt": {"speculate": speculate}})
                return r.choices[0].message.content
            if together:
                return list(await asyncio.gather(*(one(b) for b in bodies)))
            return [await one(b) for b in bodies]

    alone = asyncio.run(run("none", together=False))
    together = asyncio.run(run("prompt-lookup", together=True))
    assert together == alone
    for b, text in zip(bodies, together):
        if "response_format" in b:
            jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}}, "response_format", "wat"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
    ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs", "xml"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "at most one"),
    ({"guided_regex": "a", "sf_trt": {"ignore_eos": True}}, "guided_regex", "ignore_eos"),
    ({"guided_regex": "a", "ignore_eos": True}, "guided_regex", "ignore_eos"),
    ({"guided_regex": "a", "min_tokens": 4}, None, "min_tokens"),
])
def test_a_constraint_that_cannot_be_used_is_a_400_naming_it(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "a"}], max_tokens=5, extra_body=extra)
    err = exc.value.body
    assert err["param"] == param and words in err["message"], err
    assert err["code"] == 400


def test_langchain_with_structured_output_by_schema_and_by_function_calling(fake_server):
    """LangChain's ``with_structured_output``: ``json_schema`` sends ``response_format``,
    ``function_calling`` a tool with a named ``tool_choice`` (the grammar forces both)."""
    import langchain_openai

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=10)
        coastal: bool

    llm = langchain_openai.ChatOpenAI(base_url=f"{fake_server.url}/v1", api_key="unused", model="fake", temperature=0.5,
                                      max_tokens=200, max_retries=0, timeout=30, seed=25)
    for method in ("json_schema", "function_calling"):
        # strict: the schema forbids other keys (without it, the copy model may add keys until max_tokens)
        assert isinstance(llm.with_structured_output(City, method=method, strict=True).invoke(EXAMPLE), City)


def test_litellms_json_mode(fake_server):
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list at import
    import litellm

    r = litellm.completion(model="openai/fake", api_base=f"{fake_server.url}/v1", api_key="unused", num_retries=0, max_tokens=50,
                           temperature=0, messages=[{"role": "user", "content": "{} {} {}"}], response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {}
