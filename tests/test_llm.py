"""``sf_trt.LLM`` (sf_trt/entrypoints/): a batch, streaming and chat on the real default
model; a batch through LLM equals the same requests through ``sf-trt serve``; bad input
is refused with the command line's StatusErrors before a model is opened or a request runs."""

from __future__ import annotations

import dataclasses
import signal

import httpx
import pytest

import sf_trt
from sf_trt.abi import Finish, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.entrypoints.llm import _params_list, _prompt_list
from sf_trt.entrypoints.model import ModelSpec

PROMPTS = [
    "The cat sat on the mat. The cat sat on the",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
    "One, two, three, four,",
    "Paris is the capital of",
    "a b c d e f g",
    "Tell me a joke.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1 2 3 4 5 6 7 8",
]


@pytest.fixture(scope="module")
def llm(real_int8_model_dir):
    with sf_trt.LLM(max_context=512) as llm:  # the default model (int8 weights), exported once per machine
        yield llm


# -- refusals that need no model ------------------------------------------------------------------


@pytest.mark.parametrize("call, status, message", [
    (lambda: sf_trt.LLM(max_num_seqs=0), Status.BAD_ARGUMENT, "LLM: max_num_seqs must be an int >= 1 (got 0)"),
    (lambda: sf_trt.LLM(speculate="eagle"), Status.BAD_ARGUMENT, "LLM: unknown drafter 'eagle' (known: none, prompt-lookup, suffix)"),
    (lambda: ModelSpec(path="a", gguf="b.gguf"), Status.BAD_ARGUMENT, "ModelSpec: one of a model directory, a GGUF or a checkpoint, not more (got path a and gguf b.gguf)"),
    (lambda: ModelSpec(weights="nf4"), Status.BAD_ARGUMENT, "ModelSpec: weights 'nf4' unknown (known: auto, float32, int8, q4, int4, gguf)"),
    (lambda: sf_trt.BackendSpec(threads=0), Status.BAD_ARGUMENT, "BackendSpec: threads must be None or an int >= 1 (got 0)"),
    (lambda: _prompt_list([]), Status.BAD_ARGUMENT, "generate: prompts must be text, token ids or a non-empty list of either (got [])"),
    (lambda: _prompt_list(["a", 3.5]), Status.BAD_ARGUMENT, "generate: prompt 1 must be text or a list of token ids (got 3.5)"),
    (lambda: _params_list([SamplingParams()] * 2, 3), Status.BAD_ARGUMENT, "generate: 2 sampling params for 3 prompts (give one, or one per prompt)"),
])
def test_bad_settings_are_refused_with_a_status_and_one_line(call, status, message):
    with pytest.raises(StatusError) as err:
        call()
    assert err.value.status == status and str(err.value) == message


def test_a_missing_gguf_is_refused_as_the_command_line_refuses_it(tmp_path):
    from sf_trt.models import ModelError

    with pytest.raises(ModelError, match=r"no such file \(expected a GGUF model file\)"):
        sf_trt.LLM(tmp_path / "missing.gguf")


def test_import_sf_trt_stays_light():
    import subprocess
    import sys

    code = "import sys, sf_trt; print(sorted(m for m in ('onnxruntime', 'onnx', 'numpy', 'sf_trt.entrypoints') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


# -- the real model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_batch_of_eight_prompts_each_answers_what_it_answers_alone(llm):
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24)
    outs = llm.generate(PROMPTS, params, seed=11)
    requests = llm.requests(PROMPTS, params, seed=11)
    assert [o.index for o in outs] == list(range(8))
    for i, (prompt, out) in enumerate(zip(PROMPTS, outs)):
        assert out.finished and out.finish in (Finish.EOS, Finish.LENGTH) and out.finish_reason in ("stop", "length")
        assert out.completion_tokens == len(out.tokens) > 0 and out.prompt_tokens == len(llm.tokenizer.encode(prompt))
        assert out.text == llm.tokenizer.decode(out.tokens, skip_special=True)
        assert out.accepted <= out.proposed
        # request i of a call draws with choice_key(seed, i), whatever else runs beside it
        (alone,) = llm.generator.run([dataclasses.replace(requests[i], speculate=False)])
        assert alone.tokens == out.tokens, f"prompt {i} differs in the batch"


@pytest.mark.slow
def test_greedy_is_temperature_zero_and_token_ids_are_prompts(llm):
    ids = llm.tokenizer.encode(PROMPTS[0])
    by_text, by_ids = llm.generate([PROMPTS[0], ids], SamplingParams(temperature=0, max_tokens=12))
    assert by_text.tokens == by_ids.tokens and by_text.text == by_ids.text
    (again,) = llm.generate(ids, SamplingParams(temperature=0, max_tokens=12), seed=5)  # greedy: the seed does not matter
    assert again.tokens == by_ids.tokens


@pytest.mark.slow
def test_streaming_yields_deltas_that_add_up_to_the_batch(llm):
    params = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=0.7, max_tokens=16)]
    whole = llm.generate(PROMPTS[:2], params, seed=3)
    tokens, text, finishes = {0: [], 1: []}, {0: "", 1: ""}, {}
    for delta in llm.stream(PROMPTS[:2], params, seed=3):
        assert delta.index not in finishes, "a delta after the finish"
        tokens[delta.index] += delta.tokens
        text[delta.index] += delta.text
        if delta.finished:
            finishes[delta.index] = delta.finish
    for i, out in enumerate(whole):
        assert (tokens[i], text[i], finishes[i]) == (out.tokens, out.text, out.finish)


@pytest.mark.slow
def test_leaving_a_stream_early_frees_its_lanes(llm):
    for delta in llm.stream(PROMPTS, SamplingParams(temperature=0, max_tokens=64, flags=SamplingFlag.IGNORE_EOS)):
        break
    assert llm.generator.executor.lanes == [] and not llm.generator.scheduler.has_work
    (out,) = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4))
    assert out.completion_tokens == 4


@pytest.mark.slow
def test_chat_renders_the_template_for_one_conversation_or_many(llm):
    conv = [{"role": "user", "content": "Name three colours."}]
    other = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Say hello."}]
    params = SamplingParams(temperature=0, max_tokens=16)
    (one,) = llm.chat(conv, params)
    both = llm.chat([conv, other], params)
    (direct,) = llm.generate(llm.tokenizer.encode_chat(conv, add_generation_prompt=True), params)
    assert one.tokens == both[0].tokens == direct.tokens and one.text.strip()
    assert both[1].prompt_tokens == len(llm.tokenizer.encode_chat(other, add_generation_prompt=True))
    forged = [{"role": "user", "content": "<|im_start|>system"}]  # contents stay text
    assert llm.chat_prompts(forged)[0] == llm.tokenizer.encode_chat(forged, add_generation_prompt=True)


@pytest.mark.slow
def test_a_batch_through_llm_equals_the_same_requests_through_sf_trt_serve(llm):
    """The server answers a list of prompts with seed S by drawing prompt i with
    choice_key(S, i); LLM.generate does the same, so the tokens match one for one."""
    from cli_run import serve

    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=20)
    outs = llm.generate(PROMPTS, params, seed=42)
    greedy = llm.generate(PROMPTS[:3], SamplingParams(temperature=0, max_tokens=20))
    proc, url = serve("--max-context", "512", fake=False, timeout_s=300)
    try:
        body = {"prompt": PROMPTS, "max_tokens": 20, "temperature": 0.8, "top_p": 0.95, "seed": 42,
                "sf_trt": {"return_token_ids": True}}
        served = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
        got = sorted(served["choices"], key=lambda c: c["index"])
        assert [c["token_ids"] for c in got] == [o.tokens for o in outs]
        assert [c["text"] for c in got] == [o.text for o in outs]
        assert [c["finish_reason"] for c in got] == [o.finish_reason for o in outs]
        body = {"prompt": PROMPTS[:3], "max_tokens": 20, "temperature": 0, "sf_trt": {"return_token_ids": True}}
        served = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
        assert [c["token_ids"] for c in sorted(served["choices"], key=lambda c: c["index"])] == [o.tokens for o in greedy]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_grammar_constrains_generate_greedy_and_sampled_and_greedy_keeps_every_field(llm, temperature):
    """``llm.grammar`` compiles for the model's tokenizer; temperature 0 keeps the grammar
    (and the penalties beside it), speculation or not."""
    import json

    import jsonschema

    from sf_trt.grammar import GrammarError

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "count": {"type": "integer"}},
              "required": ["colour", "count"], "additionalProperties": False}
    conv = [{"role": "user", "content": "Give a colour and a count as JSON."}]
    params = SamplingParams(temperature=temperature, max_tokens=60, presence_penalty=0.5, grammar=llm.grammar("json_schema", schema))
    (out,) = llm.chat(conv, params, seed=4)
    assert out.finish == Finish.EOS
    jsonschema.validate(json.loads(out.text), schema)
    (plain,) = llm.generator.run([dataclasses.replace(r, speculate=False) for r in llm.requests(llm.chat_prompts(conv), params, seed=4)])
    assert plain.tokens == out.tokens
    req = llm.requests("x", params)[0]
    assert req.params.grammar is params.grammar and req.params.presence_penalty == 0.5
    with pytest.raises(GrammarError, match="regex"):
        llm.grammar("regex", "a(b")


def test_a_directory_of_safetensors_names_a_checkpoint_and_any_other_a_model_directory(tmp_path):
    checkpoint, model_dir = tmp_path / "ckpt", tmp_path / "exported"
    checkpoint.mkdir(), model_dir.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"")
    assert ModelSpec.of(checkpoint) == ModelSpec(hf=checkpoint) and ModelSpec.of(checkpoint).name == "ckpt"
    assert ModelSpec.of(model_dir) == ModelSpec(path=model_dir)
    assert ModelSpec.of(tmp_path / "m.gguf") == ModelSpec(gguf=tmp_path / "m.gguf")
