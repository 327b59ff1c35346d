"""tools/q4_error.py: per GGUF type, how --weights q4 holds a file's layer matrices and the error."""

from __future__ import annotations

import json


def test_carried_types_are_exact_and_requantized_ones_within_4_bit_error(tmp_path, load_tool, capsys):
    from tiny_gguf import write_tiny_gguf

    types = {"attn_q.weight": "Q4_0", "attn_k.weight": "Q4_1", "attn_v.weight": "Q5_0", "ffn_down.weight": "Q8_0", "ffn_up.weight": "F16"}
    write_tiny_gguf(tmp_path / "mixed.gguf", types=types)
    assert load_tool("q4_error").main([str(tmp_path / "mixed.gguf"), "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    got = json.loads((tmp_path / "e.json").read_text())
    assert set(got) == {"Q4_0", "Q4_1", "Q5_0", "Q8_0", "F16", "F32"}, out  # attn_output and ffn_gate as written: F32
    for kind in ("Q4_0", "Q4_1"):
        assert got[kind]["held"] == "carried" and got[kind]["max_abs"] <= 1e-6 and got[kind]["matrices"] == 2, out
    for kind in ("Q5_0", "Q8_0", "F16", "F32"):
        assert got[kind]["held"] == "requantized", out
        assert 0.02 < got[kind]["relative_rms"] < 0.15, out  # 4 bits: 15 steps a block
    assert "Q4_0" in out and "carried" in out and "requantized" in out


def test_int4_requantizes_the_4_bit_blocks_too(tmp_path, load_tool, capsys):
    """``--weights int4``: the Q4_0 and Q4_1 blocks q4 carries are requantized like the rest, so they
    have an error of their own (a second rounding), within what 4 bits per block give."""
    from tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "mixed.gguf", types={"attn_q.weight": "Q4_0", "attn_k.weight": "Q4_1", "ffn_up.weight": "F16"})
    assert load_tool("q4_error").main([str(tmp_path / "mixed.gguf"), "--weights", "int4", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    got = json.loads((tmp_path / "e.json").read_text())
    assert "as --weights int4 holds them" in out
    for kind in ("Q4_0", "Q4_1", "F16"):
        assert got[kind]["held"] == "requantized" and 0.0 < got[kind]["relative_rms"] < 0.15, out
