"""The model directory format (sf_trt.formats.model_dir)."""

from __future__ import annotations

import json


def test_config_json_records_the_graph_facts(tiny_model_dir):
    meta = json.loads((tiny_model_dir / "config.json").read_text())
    assert meta["graph"]["graphs"] == {"decoder.onnx": "slots", "decoder_pass.onnx": "pass"}
    assert meta["graph"]["padding_position"] == "max_context"
    assert {"decoder.onnx", "decoder_pass.onnx", "decoder.onnx.data"} <= set(meta["files"])
