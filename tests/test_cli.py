"""The command line: real runs on the default model, and bad input refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def sf_trt(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "sf_trt.cli", *args], capture_output=True, text=True, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def refused(*args: str, code: int = 1) -> str:
    proc = sf_trt(*args)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args, words",
    [
        (["generate", "--chat", "hi", "--top-p", "1.5"], "top-p in (0, 1]"),
        (["generate", "--chat", "hi", "--temperature", "-1"], "temperature >= 0"),
        (["generate", "--chat", "hi", "--max-tokens", "0"], "max tokens >= 1"),
        (["generate", "--chat", "hi", "--seed", "-3"], "seed"),
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
        (["generate", "--prompt-ids", ",".join(["5"] * 40), "--max-context", "32"], "PROMPT_TOO_LONG"),
        (["generate", "--chat", "hi", "--backend", "onnxruntime-cuda"], "no CUDAExecutionProvider"),
    ],
)
def test_bad_prompts_are_refused(args, words):
    assert words in refused(*args)


@pytest.mark.slow
def test_generate_json_is_the_same_with_and_without_speculation():
    runs = {}
    for spec in ("none", "prompt-lookup", "suffix"):
        proc = sf_trt("generate", "--prompt", "one two three four one two three four one two", "--max-tokens", "24",
                      "--temperature", "0.7", "--seed", "5", "--speculate", spec, "--json", check=True)
        runs[spec] = json.loads(proc.stdout)
    plain = runs["none"]
    assert set(plain) == {"tokens", "text", "finish", "prompt_tokens", "seconds", "tokens_per_s", "proposed", "accepted"}
    for spec in (runs["prompt-lookup"], runs["suffix"]):
        assert (spec["tokens"], spec["text"], spec["finish"]) == (plain["tokens"], plain["text"], plain["finish"])
        assert spec["proposed"] > 0
    assert plain["proposed"] == 0
    assert len(plain["tokens"]) == 24 or plain["finish"] == "eos"


@pytest.mark.slow
def test_bench_reports_identical_outputs(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "copy", "messages": [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."}], "max_tokens": 20}) + "\n"
        + json.dumps({"id": "ids", "prompt_ids": [100, 200, 300, 100, 200], "max_tokens": 12}) + "\n"
    )
    proc = sf_trt("bench", "--prompts", str(prompts), "--lanes", "2", "--json", check=True)
    report = json.loads(proc.stdout)
    assert [r["id"] for r in report["results"]] == ["copy", "ids"]
    for r in report["results"]:
        assert r["identical"] is True
        assert r["plain"]["tokens"] == r["spec"]["tokens"] > 0
        assert r["plain"]["tokens_per_s"] > 0 and r["spec"]["tokens_per_s"] > 0


def test_bad_prompt_files_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    assert "exactly one of messages, prompt, prompt_ids" in refused("bench", "--prompts", str(bad))
    bad.write_text("{not json\n")
    assert "not JSON" in refused("bench", "--prompts", str(bad))
    assert "cannot read" in refused("bench", "--prompts", str(tmp_path / "missing.jsonl"))
