"""Random byte-level damage to the files sf-trt reads, through the real command line.

A GGUF, a model directory's files, an engines manifest and a prompts file are
damaged (bytes flipped, overwritten, inserted, deleted, the file cut) and handed
to ``sf_trt.cli.main`` in-process. Every case must end in a run (exit 0) or one
clear refusal (exit 1, its last stderr line ``sf-trt: ...``, nothing else but
progress), never a traceback, and within its time limit (a hang fails the case).
Bounded for CI: ``SF_TRT_FUZZ_EXAMPLES`` cases per target (default 100; the
four targets take about 15 s on two cores, most cases being refused at once);
``pytest -s`` prints the counts (``SF_TRT_FUZZ_SHOW=1``: by kind of refusal).
"""

from __future__ import annotations

import collections
import json
import os
import re
import resource
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifests import write_engines_dir
from tiny_gguf import write_tiny_gguf

import sf_trt.cli

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SF_TRT_FUZZ_EXAMPLES", "100"))
CASE_SECONDS = 30
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
MESSAGES: dict[str, list[str]] = collections.defaultdict(list)


class Hang(Exception):
    pass


def _alarm(_signum, _frame):
    raise Hang(f"a case ran past {CASE_SECONDS}s")


CASE_MEMORY_BYTES = 6 << 30
"""The most address space a case may add to the process: a damaged file that asks for more gets a
MemoryError (the command line's "out of memory" refusal) instead of the kernel's OOM killer, which
once took a whole CI run down in this file (a 24 GB process, the case not found again in 16,000)."""


def _address_space() -> int:
    """This process's mapped bytes (``VmSize``)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``sf_trt.cli.main(argv)`` with a time limit and an address-space limit: (exit code, stderr)."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + CASE_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        code = sf_trt.cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, capsys.readouterr().err


def check_outcome(target: str, code: int, err: str) -> None:
    """A run, or one clear refusal."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 0:
        OUTCOMES[target]["ran"] += 1
        return
    assert code == 1, (code, err)
    assert lines and lines[-1].startswith("sf-trt: "), err
    assert all(line.startswith("sf_trt: ") or "%|" in line or line.startswith("sf-trt: ") for line in lines), err
    OUTCOMES[target]["refused: " + _reason(lines[-1])] += 1
    MESSAGES[target].append(lines[-1])


def _reason(line: str) -> str:
    """The kind of refusal, for the counts: the line without paths, numbers and quoted values, cut short."""
    text = re.sub(r"(/[^ :']+)+", "", line[len("sf-trt: "):])
    text = re.sub(r"'[^']*'|\d+", "_", text)
    return text[:60]


# -- damage ------------------------------------------------------------------------------


@st.composite
def damaged(draw, data: bytes, head: int = 4096, keep: int = 0):
    """``data`` with 1-4 edits at random places, half of them within the first
    ``head`` bytes past the first ``keep`` (a magic number worth getting past)."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if len(out) <= keep:
            break
        hi = len(out) - 1
        pos = draw(st.one_of(st.integers(keep, min(head, hi)), st.integers(0, hi)))
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        if kind == "flip":
            out[pos] ^= draw(st.integers(1, 255))
        elif kind == "set":
            out[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, ord("{"), ord('"'), ord("9")]))
        elif kind == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del out[pos : pos + draw(st.integers(1, 16))]
        else:
            del out[pos:]
    return bytes(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GGUF (context 64), its model directory and a sound engines directory."""
    from sf_trt.export.pipeline import export_model_dir

    d = tmp_path_factory.mktemp("fuzz")
    write_tiny_gguf(d / "tiny.gguf", context_length=64)
    model = export_model_dir(d / "tiny.gguf", d / "model", progress=False)
    return {"gguf": d / "tiny.gguf", "model": model, "engines": write_engines_dir(d / "engines")}


def _report(target: str) -> None:
    counts = OUTCOMES[target]
    print(f"\n[fuzz] {target}: {sum(counts.values())} cases, {counts['ran']} ran, {sum(counts.values()) - counts['ran']} refused")
    if os.environ.get("SF_TRT_FUZZ_SHOW"):
        for kind, n in counts.most_common():
            print(f"    {n:4d}  {kind}")


# -- targets -------------------------------------------------------------------------------------


def test_fuzz_a_damaged_gguf(tiny, capsys, monkeypatch):
    original = tiny["gguf"].read_bytes()

    @FUZZ
    @given(data=damaged(original, head=8192, keep=4))
    def case(data):
        with tempfile.TemporaryDirectory() as tmp:
            monkeypatch.setenv("SF_TRT_CACHE", os.path.join(tmp, "cache"))
            path = Path(tmp) / "damaged.gguf"
            path.write_bytes(data)
            code, err = run_cli(["generate", "--gguf", str(path), "--chat", "the", "--max-tokens", "2"], capsys)
            check_outcome("gguf", code, err)

    case()
    _report("gguf")


def test_fuzz_a_damaged_model_directory(tiny, capsys):
    names = ["config.json", "decoder.onnx", "decoder_pass.onnx", "tokenizer_config.json", "tokenizer.json", "chat_template.jinja"]
    originals = {n: (tiny["model"] / n).read_bytes() for n in names}

    @FUZZ
    @given(name=st.sampled_from(names), data=st.data())
    def case(name, data):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(shutil.copytree(tiny["model"], Path(tmp) / "model"))
            (d / name).write_bytes(data.draw(damaged(originals[name], head=2048)))
            code, err = run_cli(["generate", "--model", str(d), "--chat", "the", "--max-tokens", "2"], capsys)
            check_outcome("model directory", code, err)

    case()
    _report("model directory")


def test_fuzz_a_damaged_manifest(tiny, capsys):
    original = (tiny["engines"] / "manifest.json").read_bytes()

    @FUZZ
    @given(data=damaged(original, head=len(original)))
    def case(data):
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(shutil.copytree(tiny["engines"], Path(tmp) / "engines"))
            (d / "manifest.json").write_bytes(data)
            code, err = run_cli(["generate", "--model", str(tiny["model"]), "--prompt", "the", "--max-tokens", "2",
                                 "--backend", "tensorrt", "--engines", str(d)], capsys)
            check_outcome("manifest", code, err)

    case()
    _report("manifest")


BENCH = "\n".join(json.dumps(row) for row in [
    {"id": "chat", "kind": "grounded", "messages": [{"role": "user", "content": "the the the"}], "max_tokens": 3},
    {"id": 2, "prompt": "the thethe", "max_tokens": 2},
    {"id": "ids", "prompt_ids": [5, 6, 7, 5, 6], "max_tokens": 2},
]) + "\n"


def test_fuzz_a_damaged_prompts_file(tiny, capsys):
    @FUZZ
    @given(data=damaged(BENCH.encode(), head=len(BENCH)))
    def case(data):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "prompts.jsonl"
            path.write_bytes(data)
            code, err = run_cli(["bench", "--prompts", str(path), "--model", str(tiny["model"])], capsys)
            check_outcome("prompts file", code, err)

    case()
    _report("prompts file")
