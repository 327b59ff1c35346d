"""The model directory format (sf_trt.formats.model_dir)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from sf_trt.formats.model_dir import FORMAT_VERSION, ModelDir, ModelDirError, made_by_export


def test_config_json_records_the_graph_facts(tiny_model_dir):
    meta = json.loads((tiny_model_dir / "config.json").read_text())
    assert meta["graph"]["graphs"] == {"decoder.onnx": "slots", "decoder_pass.onnx": "pass", "decoder_pass_blocks.onnx": "pass, PV in 16-column blocks"}
    assert meta["graph"]["padding_position"] == "max_context"
    assert {"decoder.onnx", "decoder_pass.onnx", "decoder_pass_blocks.onnx", "decoder.onnx.data"} <= set(meta["files"])
    assert meta["format"] == FORMAT_VERSION and meta["precision"] == "fp32" == ModelDir.open(tiny_model_dir).precision
    assert "float32" in meta["graph"]["cache_layout"]


def test_config_json_records_the_decoders_precision(tiny_fp16_model_dir):
    meta = json.loads((tiny_fp16_model_dir / "config.json").read_text())
    assert meta["precision"] == "fp16" == ModelDir.open(tiny_fp16_model_dir).precision
    assert "float16" in meta["graph"]["cache_layout"] and "float16" in meta["graph"]["new_kv_layout"]


@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    """A copy of the tiny model directory, to damage."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("name", ["decoder.onnx.data", "decoder.onnx", "verify.onnx"])
def test_a_damaged_file_is_refused_naming_it(model_copy, name):
    ModelDir.open(model_copy)
    _flip(model_copy / name, os.path.getsize(model_copy / name) // 2)
    with pytest.raises(ModelDirError, match=rf"model/{re.escape(name)}: sha256 differs from the digest recorded at export"):
        ModelDir.open(model_copy)
    assert ModelDir.open(model_copy, verify=False).config.n_layers == 2  # the structure alone still reads


def test_a_truncated_file_is_refused_naming_it(model_copy):
    data = (model_copy / "decoder.onnx").read_bytes()
    (model_copy / "decoder.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelDirError, match=r"decoder\.onnx: sha256 differs"):
        ModelDir.open(model_copy)


def _config_edits():
    def meta_edit(fn):
        def edit(path):
            meta = json.loads(path.read_text())
            fn(meta)
            path.write_text(json.dumps(meta))
        return edit

    def raw(data):
        return lambda path: path.write_bytes(data)

    return {
        "not JSON": (raw(b"{garbage"), "not readable JSON"),
        "not UTF-8": (raw(b'{"format": 6, "x": "\xff"}'), "not readable JSON"),
        "a list": (raw(b"[1, 2]"), f"format 'list', expected {FORMAT_VERSION}"),
        "an old format": (meta_edit(lambda m: m.update(format=5)), f"format 5, expected {FORMAT_VERSION}"),
        "a value changed": (meta_edit(lambda m: m["llama"].update(n_layers=3)), "differs from the digest it records"),
        "a digest changed": (meta_edit(lambda m: m["sha256"].update({"decoder.onnx": "0" * 64})), "differs from the digest it records"),
        "files not a list": (meta_edit(lambda m: m.update(files=5, config_sha256=None)), "differs from the digest it records"),
    }


@pytest.mark.parametrize("case", sorted(_config_edits()))
def test_a_damaged_config_is_refused_in_one_line(model_copy, case):
    edit, words = _config_edits()[case]
    edit(model_copy / "config.json")
    with pytest.raises(ModelDirError, match=re.escape(words)) as err:
        ModelDir.open(model_copy)
    assert "\n" not in str(err.value) and "config.json" in str(err.value)


def test_a_config_consistent_but_malformed_is_refused(model_copy):
    from sf_trt.formats.model_dir import config_digest

    for change, words in [
        (lambda m: m.update(files=5), '"files" is not a list of file names'),
        (lambda m: m.update(files=m["files"] + ["../x"]), '"files" is not a list of file names'),
        (lambda m: m["sha256"].pop("verify.onnx"), '"sha256" does not hold one sha256 per listed file'),
        (lambda m: m.update(graph=[]), "'graph' is not an object"),
        (lambda m: m.update(weights="int3"), "weights 'int3' unknown"),
        (lambda m: m.update(precision="fp8"), "precision 'fp8' unknown (known: fp32, fp16, bf16)"),
        (lambda m: m["graph"].update(max_positions=2**40), "graph max_positions 1099511627776 is not a context length"),
        (lambda m: m["llama"].update(context_length=2**40), 'no usable "llama" config (LlamaConfig: context_length 1099511627776 exceeds'),
        (lambda m: m["llama"].update(vocab="many"), 'no usable "llama" config'),
    ]:
        good = (model_copy / "config.json").read_text()
        meta = json.loads(good)
        change(meta)
        meta["config_sha256"] = config_digest(meta)  # damage that keeps the config's own digest
        (model_copy / "config.json").write_text(json.dumps(meta))
        with pytest.raises(ModelDirError, match=re.escape(words)):
            ModelDir.open(model_copy)
        (model_copy / "config.json").write_text(good)
    ModelDir.open(model_copy)


def test_a_missing_file_is_named(model_copy):
    (model_copy / "verify.onnx").unlink()
    with pytest.raises(ModelDirError, match=r"model: verify\.onnx is missing"):
        ModelDir.open(model_copy)
    with pytest.raises(ModelDirError, match=r"no such directory"):
        ModelDir.open(model_copy / "nowhere")


def test_made_by_export_tells_an_export_from_a_users_folder(model_copy, tmp_path):
    ModelDir.open(model_copy)  # (may leave the digest stamps: still an export)
    assert made_by_export(model_copy)
    (model_copy / "notes.txt").write_text("mine")
    assert not made_by_export(model_copy)
    (tmp_path / "empty").mkdir()
    assert not made_by_export(tmp_path / "empty") and not made_by_export(tmp_path / "absent")
