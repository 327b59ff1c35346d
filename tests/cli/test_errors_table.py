"""docs/errors.md, "The command line": every row run through sf_trt.cli.main.

Each row's case (the first column) names a function here that makes the files
of the case and returns the command line; the test runs it in-process and
compares the exit code and the stderr line with the row (``<DIR>``, ``<FILE>``,
``<GGUF>``, ``<CORES>`` replaced by the case's values, ``…`` any text). A refusal
is the last line of stderr and the only line that is not progress; a note
(exit 0) is one of its lines. A row without a case, or a case without a row,
fails; so does a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from manifests import write_engines_dir
from tiny_gguf import write_tiny_gguf

import sf_trt.cli

ROOT = Path(__file__).resolve().parents[2]
ERRORS_MD = ROOT / "docs" / "errors.md"


def documented() -> dict[str, tuple[int, str]]:
    """The command-line rows: case -> (exit code, message)."""
    section = ERRORS_MD.read_text().split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[int, str]] = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| (.+?) \| (.+?) \| (\d+) \| (``? ?)(.*?)( ?``?) \|", line)
        if m:
            case, _sent, code, _open, message, _close = m.groups()
            assert case not in rows, f"docs/errors.md lists {case!r} twice"
            rows[case] = (int(code), message)
    return rows


# -- the cases ---------------------------------------------------------------------------------


class Workspace:
    """A case's files: ``tmp`` for its own, and the shared tiny model (context 64)."""

    def __init__(self, tmp: Path, shared: dict[str, Path]) -> None:
        self.tmp, self.shared, self.subs = tmp, shared, {}

    def model_copy(self) -> Path:
        d = Path(shutil.copytree(self.shared["model"], self.tmp / "model"))
        self.subs["<DIR>"] = str(d)
        return d

    def file(self, name: str, data: bytes | str) -> Path:
        p = self.tmp / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        self.subs["<FILE>"] = str(p)
        return p

    def gguf(self, **kw) -> Path:
        p = self.tmp / "crafted.gguf"
        write_tiny_gguf(p, context_length=64, **kw)
        self.subs["<FILE>"] = str(p)
        return p

    def generate(self, *args: str) -> list[str]:
        return ["generate", "--model", str(self.shared["model"]), "--max-tokens", "4", *args]

    def bench(self, text: str | bytes) -> list[str]:
        return ["bench", "--prompts", str(self.file("p.jsonl", text)), "--model", str(self.shared["model"]), "--max-tokens", "2"]

    def engines(self, damage: Callable[[Path], None] | None = None) -> list[str]:
        d = write_engines_dir(self.tmp / "engines")
        if damage is not None:
            damage(d)
        self.subs["<DIR>"] = str(d)
        return self.generate("--prompt", "the", "--backend", "tensorrt", "--engines", str(d))


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_manifest(fn):
    def damage(d: Path) -> None:
        data = json.loads((d / "manifest.json").read_text())
        fn(data)
        (d / "manifest.json").write_text(json.dumps(data))
    return damage


def _export_into_notes(w):
    (w.tmp / "notes").mkdir()
    (w.tmp / "notes" / "notes.txt").write_text("mine")
    w.subs["<DIR>"] = str(w.tmp / "notes")
    return ["export", "--gguf", str(w.shared["gguf"]), "--out", str(w.tmp / "notes")]


def _cache_not_writable(w):
    w.file("cache", "a file, not a directory")
    w.env["SF_TRT_CACHE"] = str(w.tmp / "cache")
    return ["generate", "--gguf", str(w.shared["gguf"]), "--prompt", "the"]


def _damaged_config(w, fn):
    d = w.model_copy()
    fn(d / "config.json")
    return ["generate", "--model", str(d), "--prompt", "the"]


def _edited_config(path: Path) -> None:
    meta = json.loads(path.read_text())
    meta["llama"]["n_layers"] = 3
    path.write_text(json.dumps(meta))


def _without(name):
    def case(w):
        d = w.model_copy()
        (d / name).unlink()
        return ["generate", "--model", str(d), "--prompt", "the"]
    return case


def _nan(name, arr):
    if name == "blk.1.attn_v.weight":
        arr = arr.copy()
        arr[2, 3] = np.nan
    return arr


def _rehashed(w, change) -> list[str]:
    """A copy of the model changed by ``change(dir, meta)``, its digests recorded anew: what a
    crafted directory looks like, its files matching their digests."""
    from sf_trt.formats.files import sha256_file
    from sf_trt.formats.model_dir import config_digest

    d = w.model_copy()
    meta = json.loads((d / "config.json").read_text())
    change(d, meta)
    meta["sha256"] = {name: sha256_file(d / name) for name in meta["sha256"]}
    meta["config_sha256"] = config_digest(meta)
    (d / "config.json").write_text(json.dumps(meta))
    return ["generate", "--model", str(d), "--prompt", "the"]


def _cut_graph(d, meta):
    (d / "decoder_pass.onnx").write_bytes((d / "decoder_pass.onnx").read_bytes()[:3000])


def _data_linked_out(w):
    def link(d, meta):
        outside = w.tmp / "elsewhere.data"
        shutil.move(d / "decoder.onnx.data", outside)
        (d / "decoder.onnx.data").symlink_to(outside)
        w.subs["<FILE>"] = str(outside)
    return _rehashed(w, link)


def _another_model_type(w):
    d = w.tmp / "ckpt"
    shutil.copytree(ROOT / "tests" / "fixtures" / "models" / "llama", d)
    conf = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**conf, "model_type": "gpt_neox"}))
    w.subs["<DIR>"] = str(d)
    return ["generate", "--hf", str(d), "--prompt", "the"]


LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"

CASES: dict[str, Callable[[Workspace], list[str]]] = {
    # files and directories
    "export into a folder of your files": _export_into_notes,
    "export onto a file": lambda w: ["export", "--gguf", str(w.shared["gguf"]), "--out", str(w.file("out", "x"))],
    "export under a file": lambda w: ["export", "--gguf", str(w.shared["gguf"]), "--out", str(w.file("out", "x") / "model")],
    "cache not writable": _cache_not_writable,
    # model directories
    "damaged weights": lambda w: (_flip(w.model_copy() / "decoder.onnx.data"), ["generate", "--model", str(w.tmp / "model"), "--prompt", "the"])[1],
    "graph cut short": lambda w: _damaged_config(w, lambda p: (p.parent / "decoder.onnx").write_bytes((p.parent / "decoder.onnx").read_bytes()[:5000])),
    "config not JSON": lambda w: _damaged_config(w, lambda p: p.write_text("garbage")),
    "config edited": lambda w: _damaged_config(w, _edited_config),
    "tokenizer missing": _without("tokenizer.json"),
    "graph cut short, digests redone": lambda w: _rehashed(w, _cut_graph),
    "weights linked out of the directory": _data_linked_out,
    "config disagrees with the graph, digests redone": lambda w: _rehashed(w, lambda d, meta: meta["llama"].update(n_layers=3)),
    "not a model directory": lambda w: (w.file("notes.txt", "mine"), w.subs.update({"<DIR>": str(w.tmp)}), ["generate", "--model", str(w.tmp), "--prompt", "the"])[2],
    # GGUF files
    "no such GGUF": lambda w: (w.subs.update({"<FILE>": str(w.tmp / "none.gguf")}), ["generate", "--gguf", str(w.tmp / "none.gguf"), "--prompt", "the"])[1],
    "not a GGUF": lambda w: ["generate", "--gguf", str(w.file("text.gguf", "not a gguf at all")), "--prompt", "the"],
    "GGUF cut short": lambda w: ["generate", "--gguf", str(w.file("cut.gguf", w.shared["gguf"].read_bytes()[:120000])), "--prompt", "the"],
    "block count its tensors lack": lambda w: ["generate", "--gguf", str(w.gguf(meta={"block_count": 10**9})), "--prompt", "the"],
    "dims its tensors lack": lambda w: ["generate", "--gguf", str(w.gguf(meta={"feed_forward_length": 4096})), "--prompt", "the"],
    "weights not finite": lambda w: ["generate", "--gguf", str(w.gguf(tensor_fn=_nan)), "--prompt", "the"],
    "another architecture": lambda w: ["generate", "--gguf", str(w.gguf(arch="gpt2")), "--prompt", "the"],
    "a tensor the model would not use": lambda w: ["generate", "--gguf", str(w.gguf(family_name="phi3", extra={"blk.0.attn_q.bias": np.zeros(64, np.float32)})), "--prompt", "the"],
    "a tensor the family needs, missing": lambda w: ["generate", "--gguf", str(w.gguf(family_name="qwen3", skip=("blk.1.attn_k_norm.weight",))), "--prompt", "the"],
    "rope scaling not computed": lambda w: ["generate", "--gguf", str(w.gguf(meta={"rope_scaling_type": "yarn"})), "--prompt", "the"],
    "q4 on dims not whole blocks": lambda w: ["generate", "--gguf", str(w.gguf(shape={"ffn": 100})), "--prompt", "the", "--weights", "q4"],
    "4-bit weights below fp32": lambda w: ["export", "--gguf", str(w.gguf()), "--out", str(w.tmp / "m16"), "--weights", "int4", "--precision", "fp16"],
    # checkpoint directories
    "no such checkpoint": lambda w: (w.subs.update({"<DIR>": str(w.tmp / "none")}), ["generate", "--hf", str(w.tmp / "none"), "--prompt", "the"])[1],
    "another model type": _another_model_type,
    # prompts and sizes
    "prompt not UTF-8": lambda w: w.generate("--prompt", "hi\udcff"),
    "chat not UTF-8": lambda w: w.generate("--chat", "\udcfehi"),
    "chat template that loops": lambda w: ["generate", "--gguf", str(w.gguf(template=LOOPS)), "--chat", "hi"],
    "empty prompt": lambda w: w.generate("--prompt", ""),
    "token outside the vocabulary": lambda w: w.generate("--prompt-ids", "1,2,99999"),
    "prompt past the model's context": lambda w: w.generate("--prompt", "x" * 70),
    "prompt past --max-context": lambda w: w.generate("--prompt", "x" * 40, "--max-context", "32"),
    "--max-context past the model's": lambda w: w.generate("--prompt", "the", "--max-context", "100"),
    "flag out of its range": lambda w: w.generate("--prompt", "the", "--top-p", "1.5"),
    "output cut by the context (a note)": lambda w: ["generate", "--model", str(w.shared["model"]), "--prompt", "x" * 50, "--max-tokens", "100"],
    "more threads than cores (a note)": lambda w: w.generate("--prompt", "the", "--threads", "1000"),
    # prompts files
    "bench line not an object": lambda w: w.bench('{"prompt": "the"}\n5\n'),
    "bench line null": lambda w: w.bench("null\n"),
    "bench prompt not a string": lambda w: w.bench('{"prompt": 5}\n'),
    "bench id an object": lambda w: w.bench('{"id": {"x": 1}, "prompt": "the"}\n'),
    "bench file not UTF-8": lambda w: w.bench(b'{"prompt": "the"}\n{"prompt": "\xff"}\n'),
    "bench line not JSON": lambda w: w.bench("{not json\n"),
    "bench unknown key": lambda w: w.bench('{"prompt": "the", "max_token": 5}\n'),
    "bench id used twice": lambda w: w.bench('{"id": 1, "prompt": "the"}\n{"id": "1", "prompt": "the"}\n'),
    "bench messages malformed": lambda w: w.bench('{"messages": [{"role": "user"}]}\n'),
    "bench token outside the vocabulary": lambda w: w.bench('{"prompt_ids": [1, 2, 99999]}\n'),
    "bench prompt past the context": lambda w: w.bench('{"prompt": "the"}\n{"id": "long", "prompt": "' + "x" * 80 + '"}\n'),
    "bench file of no prompts": lambda w: w.bench("\n\n"),
    # TensorRT engines
    "no manifest": lambda w: w.engines(lambda d: (d / "manifest.json").unlink()),
    "manifest not JSON": lambda w: w.engines(lambda d: (d / "manifest.json").write_text("{garbage")),
    "engine file outside the directory": lambda w: w.engines(_edit_manifest(lambda m: m["engines"]["decoder"].update(engine_file="../../etc/passwd"))),
    "engine bytes changed": lambda w: w.engines(lambda d: (d / "decoder.engine").write_bytes(b"another engine")),
    "no TensorRT here": lambda w: w.engines(),
    "engine of more than one shape": lambda w: w.engines(_edit_manifest(_dynamic_decoder_profile)),
}


def _dynamic_decoder_profile(manifest: dict) -> None:
    """The decoder's profile made 1..8 rows (an engine built by an older sf-trt build)."""
    profile = manifest["engines"]["decoder"]["settings"]["profiles"][0]
    profile["dims"]["rows"][0] = 1
    for shapes in profile["inputs"].values():
        shapes["min"][0] = 1

ELSEWHERE = {
    "export ended by SIGTERM": ("tests/export/test_pipeline.py", "test_an_export_killed_midway_keeps_the_earlier_one_and_leaves_no_temporary"),
}
"""Rows a test elsewhere makes (a process killed mid-export): that test asserts the row's message."""


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    from sf_trt.export.pipeline import export_model_dir

    d = tmp_path_factory.mktemp("tiny64")
    write_tiny_gguf(d / "tiny.gguf", context_length=64)
    return {"gguf": d / "tiny.gguf", "model": export_model_dir(d / "tiny.gguf", d / "model", progress=False)}


def test_every_row_has_a_case_and_every_case_a_row():
    rows, cases = set(documented()), set(CASES) | set(ELSEWHERE)
    assert not rows - cases, f"docs/errors.md rows no case makes: {sorted(rows - cases)}"
    assert not cases - rows, f"cases without a row in docs/errors.md: {sorted(cases - rows)}"


@pytest.mark.parametrize("case", sorted(ELSEWHERE))
def test_rows_made_elsewhere_are_asserted_there(case):
    path, name = ELSEWHERE[case]
    source = (ROOT / path).read_text()
    assert f"def {name}(" in source and documented()[case][1] in source


def _pattern(message: str, subs: dict[str, str]) -> re.Pattern:
    parts = re.split(r"(<[A-Z]+>|…)", message)
    out = []
    for part in parts:
        if part == "…":
            out.append(".*?")
        elif part in subs:
            out.append(re.escape(subs[part]))
        else:
            out.append(re.escape(part))
    return re.compile("".join(out))


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = sf_trt.cli.main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_row_is_what_the_command_line_says(case, shared, tmp_path, monkeypatch, capsys):
    if case == "no TensorRT here" and importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is importable here")
    code_expected, message = documented()[case]
    w = Workspace(tmp_path, shared)
    w.env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    w.subs["<CORES>"] = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    argv = CASES[case](w)
    for key, value in w.env.items():
        monkeypatch.setenv(key, value)
    code, err = _run(argv, capsys)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    pattern = _pattern(message, w.subs)
    if code_expected == 0:
        assert code == 0 and any(pattern.fullmatch(line) for line in lines), err
    else:
        assert code == code_expected, err
        assert lines and pattern.fullmatch(lines[-1]), f"{lines[-1] if lines else ''!r}\n  !~ {pattern.pattern!r}"
        if code == 1:  # one line: everything else on stderr is progress
            assert all(line.startswith("sf_trt: ") or "%|" in line for line in lines[:-1]), err
