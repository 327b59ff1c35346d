"""``sf-trt generate`` and the flags every command shares: runs, refusals, exit codes."""

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
    for spec in ("none", "prompt-lookup"):
        proc = sf_trt("generate", "--prompt", "one two three four one two three four one two", "--max-tokens", "24",
                      "--temperature", "0.7", "--seed", "5", "--speculate", spec, "--json", check=True)
        runs[spec] = json.loads(proc.stdout)
    plain, spec = runs["none"], runs["prompt-lookup"]
    assert set(plain) == {"tokens", "text", "finish", "prompt_tokens", "seconds", "tokens_per_s", "proposed", "accepted"}
    assert (spec["tokens"], spec["text"], spec["finish"]) == (plain["tokens"], plain["text"], plain["finish"])
    assert plain["proposed"] == 0 and spec["proposed"] > 0
    assert len(plain["tokens"]) == 24 or plain["finish"] == "eos"
