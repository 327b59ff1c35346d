"""Structured output on the real SmolLM2 model: 20 varied extraction prompts, each
constrained by a JSON schema, greedy and sampled.

Every output parses and validates (``jsonschema``), ends with EOS where its grammar
accepts, and is token for token the same with speculation off (one request at a time) and
on (four lanes sharing passes, drafts in every pass); drafts are proposed and accepted, so
rows past a draft prefix were masked by the grammar state after that prefix.
"""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from sf_trt.abi import Finish, Sampling, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.generate import Generator
from sf_trt.grammar import compile_grammar, token_table
from sf_trt.scheduler import DraftPolicy, Request

pytestmark = pytest.mark.slow


def _obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


STR, INT, BOOL = {"type": "string", "maxLength": 40}, {"type": "integer"}, {"type": "boolean"}
SCHEMAS = {
    "person": _obj(name=STR, age=INT, city=STR),
    "product": _obj(product=STR, price=INT, in_stock=BOOL),
    "event": _obj(title=STR, year=INT, attendees={"type": "array", "items": STR, "maxItems": 4}),
    "review": _obj(rating={"type": "integer", "minimum": 1, "maximum": 5}, sentiment={"enum": ["positive", "negative", "mixed"]}),
    "book": _obj(title=STR, author=STR, pages=INT),
}
TEXTS = {
    "person": ["John Smith is 25 years old and lives in Paris.", "Maria Garcia, aged 41, moved to Madrid last year.",
               "The engineer Wei Chen (33) works in Shanghai.", "Olaf Berg is a 67 year old fisherman from Bergen."],
    "product": ["The blue kettle costs 30 dollars and is in stock.", "Sold out: the walnut desk, priced at 450 dollars.",
                "Our wireless mouse is 19 dollars; plenty in stock.", "The garden hose (25 dollars) is out of stock."],
    "event": ["PyCon 2019 was attended by Ana, Ben and Chloe.", "In 1969 the moon landing was watched by Tom and Ray.",
              "The 2022 team offsite: Dana, Eli, Finn and Gus came.", "Nobody but Ida went to the 2005 book fair."],
    "review": ["Five stars, I loved every minute of it!", "Terrible, broke after a day. One star.",
               "Good screen but the battery is weak; three stars.", "Pretty great overall, four out of five."],
    "book": ["Moby Dick by Herman Melville has 635 pages.", "Dune, written by Frank Herbert, runs to 412 pages.",
             "Emma (Jane Austen) is 474 pages long.", "The 96-page Animal Farm is by George Orwell."],
}


def cases(tok):
    for kind, texts in TEXTS.items():
        for text in texts:
            fields = ", ".join(SCHEMAS[kind]["properties"])
            msg = f"Extract the {kind} from this text as JSON with the fields {fields}.\n\nText: {text}"
            yield kind, tok.encode(tok.apply_chat_template([{"role": "user", "content": msg}]))


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_twenty_schemas_outputs_validate_and_are_the_same_with_speculation_on_and_off(real_model_dir, real_tokenizer, mode):
    tok = real_tokenizer
    with OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=384, threads=2) as prims:
        caps = prims.capabilities
        table = token_table(tok, caps.vocab, caps.eos)
        grammars = {kind: compile_grammar("json_schema", schema, table) for kind, schema in SCHEMAS.items()}
        todo = list(cases(tok))
        assert len(todo) == 20
        requests = [Request(ids, mode, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=120, grammar=grammars[kind]), seed=11 + i)
                    for i, (kind, ids) in enumerate(todo)]
        gen = Generator(prims, policy=DraftPolicy())  # drafts in every pass
        plain = [gen.run([dataclasses.replace(r, speculate=False)])[0] for r in requests]
        spec = gen.run(requests)
    for (kind, _), p, s in zip(todo, plain, spec):
        assert (s.tokens, s.finish) == (p.tokens, p.finish), kind
        assert p.finish == Finish.EOS, (kind, tok.decode(p.tokens))
        jsonschema.validate(json.loads(tok.decode(p.tokens, skip_special=True)), SCHEMAS[kind])
    assert sum(s.accepted for s in spec) > 0, "drafts were accepted: rows past a draft prefix were masked"
