"""``sf-trt generate`` and the flags every command shares: runs, refusals, exit codes."""

from __future__ import annotations

import json
import os

import pytest
from cli_run import refused, sf_trt
from tiny_gguf import write_tiny_gguf


@pytest.mark.parametrize(
    "args, words",
    [
        (["generate", "--chat", "hi", "--top-p", "1.5"], "top-p in (0, 1]"),
        (["generate", "--chat", "hi", "--temperature", "-1"], "temperature >= 0"),
        (["generate", "--chat", "hi", "--max-tokens", "0"], "max tokens >= 1"),
        (["generate", "--chat", "hi", "--seed", "-3"], "seed"),
        (["generate", "--chat", "hi", "--presence-penalty", "3"], "a penalty in [-2, 2]"),
        (["generate", "--chat", "hi", "--repetition-penalty", "0"], "a penalty in [2**-16, 2**16]"),
        (["generate", "--chat", "hi", "--min-tokens", "-1"], "min tokens >= 0"),
        (["generate", "--prompt-ids", "1,x"], "comma-separated token ids"),
        (["generate"], "one of the arguments --prompt --chat --prompt-ids is required"),
        (["bench", "--prompts", "p.jsonl", "--lanes", "0"], "lanes in 1..64"),
    ],
)
def test_out_of_range_flags_exit_2_with_the_reason(args, words):
    assert words in refused(*args, code=2)


def test_missing_truncated_and_wrong_gguf_files_are_refused(tmp_path):
    assert "no such file" in refused("generate", "--chat", "hi", "--gguf", str(tmp_path / "none.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    assert "junk.gguf" in refused("generate", "--chat", "hi", "--gguf", str(junk))


@pytest.mark.slow
def test_unsupported_architecture_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    import numpy as np

    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = refused("export", "--gguf", str(path))
    assert "gpt2" in line and "llama" in line, line


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, words",
    [
        (["generate", "--prompt", ""], "EMPTY_PROMPT"),
        (["generate", "--prompt-ids", "1,2,99999999"], "outside the vocabulary"),
        (["generate", "--prompt-ids", ",".join(["5"] * 40), "--max-context", "32"], "prompt: 40 tokens leave no room in --max-context 32"),
        (["generate", "--chat", "hi", "--backend", "onnxruntime-cuda"], "no CUDAExecutionProvider"),
    ],
)
def test_bad_prompts_are_refused(args, words):
    assert words in refused(*args)


@pytest.mark.slow
def test_generate_json_is_the_same_with_and_without_speculation():
    runs = {}
    for spec in ("none", "prompt-lookup", "suffix", "spin"):  # spin: the last one again, its threads spinning
        flags = ["--speculate", "suffix", "--spin"] if spec == "spin" else ["--speculate", spec]
        proc = sf_trt("generate", "--prompt", "one two three four one two three four one two", "--max-tokens", "24",
                      "--temperature", "0.7", "--seed", "5", *flags, "--json", check=True)
        runs[spec] = json.loads(proc.stdout)
    plain = runs["none"]
    assert runs["spin"]["tokens"] == plain["tokens"]
    assert set(plain) == {"tokens", "text", "finish", "prompt_tokens", "seconds", "tokens_per_s", "proposed", "accepted", "error"}
    for spec in (runs["prompt-lookup"], runs["suffix"]):
        assert plain["error"] is None and spec["error"] is None
        assert (spec["tokens"], spec["text"], spec["finish"]) == (plain["tokens"], plain["text"], plain["finish"])
        assert spec["proposed"] > 0
    assert plain["proposed"] == 0
    assert len(plain["tokens"]) == 24 or plain["finish"] == "eos"


@pytest.mark.slow
def test_streamed_generate_gives_its_first_token_a_tick_of_its_own_and_the_json_run_s_text():
    """Streamed to a terminal, `sf-trt generate` reports its first token one pass after the
    prefill (the scheduler's first_token_tick); what it prints is the --json run's text."""
    from sf_trt.cli import build_parser
    from sf_trt.cli.generate import generator
    from sf_trt.fake import FakeConfig, FakePrimitives

    args = build_parser().parse_args(["generate", "--chat", "hi"])
    prims = FakePrimitives(FakeConfig(vocab=257, eos=256, max_lanes=1, max_context=64))
    assert generator(prims, args, first_token_tick=True).scheduler.config.first_token_tick
    assert not generator(prims, args).scheduler.config.first_token_tick  # bench's: the batch profile as is
    prompt = ["--prompt", "one two three four one two three four one two", "--max-tokens", "24", "--seed", "5"]
    streamed = sf_trt("generate", *prompt, check=True).stdout
    plain = json.loads(sf_trt("generate", *prompt, "--json", check=True).stdout)
    assert streamed == plain["text"] + "\n"


@pytest.mark.slow
def test_generate_with_penalties_is_the_same_with_and_without_speculation_and_not_the_unpenalised_text():
    prompt = ["--prompt", "one two three four one two three four one two", "--max-tokens", "24", "--seed", "5", "--json"]
    penalties = ["--presence-penalty", "1.0", "--frequency-penalty", "0.5", "--repetition-penalty", "1.3", "--min-tokens", "20"]
    runs = {spec: json.loads(sf_trt("generate", *prompt, *penalties, "--speculate", spec, check=True).stdout) for spec in ("none", "prompt-lookup")}
    assert runs["none"]["tokens"] == runs["prompt-lookup"]["tokens"] and len(runs["none"]["tokens"]) >= 20
    assert json.loads(sf_trt("generate", *prompt, "--speculate", "none", check=True).stdout)["tokens"] != runs["none"]["tokens"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, words",
    [
        (["--top-k", "5000"], "request 0: top_k 5000 exceeds the sampler's limit 1024 [BAD_SAMPLING_PARAMS]"),
        (["--temperature", "1e-40"], "temperature 1e-40 is below the floor 1.52587890625e-05 (2**-16)"),
        (["--temperature", "1e-38"], "temperature 1e-38 is below the floor"),
    ],
)
def test_the_refusal_that_happened_is_the_one_reported(flags, words):
    """Not `release(lane=0): lane not admitted`: the Generator releases only lanes it admitted."""
    line = refused("generate", "--prompt", "Hi", *flags)
    assert words in line, line


def test_a_backend_fault_mid_generation_is_one_line_and_a_nonzero_exit(tmp_path, monkeypatch, capsys):
    from sf_trt.cli import launch, main
    from sf_trt.faults import Fault, FaultyPrimitives
    from tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path / "cache"))
    real_open = launch.open_backend
    monkeypatch.setattr(launch, "open_backend", lambda *a, **kw: FaultyPrimitives(real_open(*a, **kw), [Fault("decode", 3)]))
    import sf_trt.cli.generate as generate_cmd

    monkeypatch.setattr(generate_cmd, "open_backend", launch.open_backend)
    code = main(["generate", "--gguf", str(tmp_path / "tiny.gguf"), "--prompt-ids", "1,2,3", "--max-tokens", "8",
                 "--max-draft", "1", "--speculate", "none"])
    err = capsys.readouterr().err
    assert code == 1
    assert "sf-trt: generation failed after 2 tokens: decode forward (lane 0): InjectedFault" in err
    assert "Traceback" not in err


def test_first_use_progress_never_reaches_stdout(tmp_path):
    """The export on first use (progress, notes) goes to stderr; stdout is the answer alone."""
    write_tiny_gguf(tmp_path / "tiny.gguf")
    env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    args = ("generate", "--gguf", str(tmp_path / "tiny.gguf"), "--prompt", "the the", "--max-tokens", "6", "--threads", "1000")
    first = sf_trt(*args, check=True, env=env)
    assert "exported" in first.stderr and "capped to the" in first.stderr
    again = json.loads(sf_trt(*args, "--json", check=True, env=env).stdout)
    assert first.stdout == again["text"] + "\n"


def test_small_context_models_work_without_flags_and_refusals_name_the_users_numbers(tmp_path):
    write_tiny_gguf(tmp_path / "t64.gguf", context_length=64)
    env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    gguf = ("--gguf", str(tmp_path / "t64.gguf"))
    sf_trt("generate", *gguf, "--prompt", "the", check=True, env=env)  # default --max-tokens 256 > 64: runs, stops at 64
    out = json.loads(sf_trt("generate", *gguf, "--prompt", "x" * 60, "--json", check=True, env=env).stdout)
    assert out["finish"] == "context" and out["prompt_tokens"] + len(out["tokens"]) == 64
    proc = sf_trt("generate", *gguf, "--prompt", "x" * 64, env=env)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == "sf-trt: prompt: 64 tokens leave no room in the model's context of 64"


def test_a_default_sized_window_accepts_a_prompt_that_fits_the_model(tmp_path):
    """A 400-token prompt with the default 256 tokens to go needs 656 positions; the model has 512: it runs to 512."""
    write_tiny_gguf(tmp_path / "tiny.gguf")  # context 512
    proc = sf_trt("generate", "--gguf", str(tmp_path / "tiny.gguf"), "--prompt", "x" * 400, "--json", check=True,
                  env={"SF_TRT_CACHE": str(tmp_path / "cache")})
    out = json.loads(proc.stdout)
    assert out["finish"] == "context" and out["prompt_tokens"] + len(out["tokens"]) == 512


def test_a_damaged_export_in_the_cache_is_rebuilt_and_the_answer_is_the_same(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    args = ("generate", "--gguf", str(tmp_path / "tiny.gguf"), "--prompt", "the the", "--max-tokens", "6")
    healthy = sf_trt(*args, check=True, env=env).stdout
    (data,) = (tmp_path / "cache" / "models").glob("*/decoder.onnx.data")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    again = sf_trt(*args, check=True, env=env)
    assert again.stdout == healthy and "decoder.onnx.data: sha256 differs" in again.stderr and "exported" in again.stderr


@pytest.mark.slow
def test_a_byte_flipped_in_the_cached_default_gguf_is_fetched_again_never_empty_output(real_gguf, tmp_path):
    """The default model: the GGUF is checked against its pinned sha256 before an export; a damaged one is
    extracted again from the wheel, and the answer is the healthy cache's."""
    from sf_trt.models import DEFAULT_MODEL

    args = ("generate", "--prompt", "The capital of France is", "--max-tokens", "8")
    healthy = sf_trt(*args, check=True).stdout  # the shared cache
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "wheels").mkdir()
    os.link(real_gguf.parents[1] / "wheels" / DEFAULT_MODEL.wheel, cache / "wheels" / DEFAULT_MODEL.wheel)
    raw = bytearray(real_gguf.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    (cache / "gguf" / real_gguf.name).write_bytes(bytes(raw))
    proc = sf_trt(*args, check=True, env={"SF_TRT_CACHE": str(cache)})
    assert proc.stdout == healthy and proc.stdout.strip()
    assert "not the expected bytes" in proc.stderr and "extracting it again from the wheel" in proc.stderr


PEAK_RSS_BUDGET_MB = 400
"""Issue 10: the most resident memory `sf-trt generate` on the default model may take."""


# Runs a command and prints its exit status and peak RSS (kB) as JSON on stderr's last line. The
# command is started from this small process, not from pytest's: Linux folds the memory of the
# process that execs (pytest's, gigabytes after a long session) into the child's ru_maxrss.
_PEAK_RSS_OF = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({"exit": os.waitstatus_to_exitcode(status), "max_rss_kb": usage.ru_maxrss}), file=sys.stderr)
"""


@pytest.mark.slow
def test_generate_on_the_default_model_peaks_within_the_memory_budget(real_int8_model_dir):
    """The whole process, from start to exit (imports, tokenizer, the decoder session's
    creation, 192 greedy tokens): its peak RSS as the kernel counts it (``wait4``'s
    ``ru_maxrss``). The default model is exported beforehand (the fixture), so no export
    runs in the child; docs/benchmarks.md says where the memory goes."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sf_trt.cli", "generate", "--chat", "Write a short story about a lighthouse keeper.",
            "--max-tokens", "192", "--ignore-eos", "--threads", "2", "--json"]
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS_OF, *argv], capture_output=True, text=True, timeout=600)
    measured = json.loads(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0 and measured["exit"] == 0, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 192
    peak_mb = measured["max_rss_kb"] / 1024  # kilobytes on Linux
    assert peak_mb <= PEAK_RSS_BUDGET_MB, f"peak RSS {peak_mb:.0f} MB, budget {PEAK_RSS_BUDGET_MB} MB"


def test_running_out_of_memory_is_one_line_naming_the_command(monkeypatch, capsys):
    """A MemoryError (a damaged model file can ask for any amount; tests/cli/test_fuzz_files.py caps each
    case's address space so one gets this instead of the OOM killer) is refused in one line, exit 1."""
    import sf_trt.cli
    import sf_trt.cli.export

    def greedy(_args):
        raise MemoryError

    monkeypatch.setattr(sf_trt.cli.export, "cmd_export", greedy)
    assert sf_trt.cli.main(["export"]) == 1
    assert capsys.readouterr().err.strip() == (
        "sf-trt: out of memory in `sf-trt export`: the model or the request asks for more than this process can have "
        "(a damaged model file can ask for any amount)"
    )
