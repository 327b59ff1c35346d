"""tools/bench_peers.py's parts that need no peer installed: the prefill prompts and the flag."""

from __future__ import annotations

import pytest


def test_prefill_prompts_are_the_bench_prompts_ids_in_turn_repeated_and_cut_to_each_length(load_tool):
    bench_peers = load_tool("bench_peers")
    encoded = [({"id": "a"}, [5, 6, 7], None, [5, 6, 7]), ({"id": "b"}, [8, 9], None, [8, 9])]
    assert bench_peers.prefill_ids(encoded, 4) == [5, 6, 7, 8]
    assert bench_peers.prefill_ids(encoded, 12) == [5, 6, 7, 8, 9] * 2 + [5, 6]
    assert bench_peers.prefill_ids(encoded, 5) == [5, 6, 7, 8, 9]


@pytest.mark.parametrize("text, words", [("256,x", "comma-separated prompt lengths"), ("0,256", "prompt lengths >= 1"), (",", ">= 1")])
def test_bad_prefill_lengths_are_refused_naming_what_was_given(load_tool, capsys, text, words):
    bench_peers = load_tool("bench_peers")
    with pytest.raises(SystemExit) as exc:
        bench_peers._parser().parse_args(["--prefill", text])
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_prefill_lengths_are_parsed_in_order(load_tool):
    assert load_tool("bench_peers")._parser().parse_args(["--prefill", "256,1024,4096"]).prefill == [256, 1024, 4096]


@pytest.mark.parametrize("policy, spins", [(None, True), ("ACTIVE", True), ("PASSIVE", False), ("passive", False)])
def test_sf_trt_runs_with_its_threads_waiting_as_llama_cpps_do(load_tool, tmp_path, monkeypatch, policy, spins):
    """llama.cpp's OpenMP threads spin unless OMP_WAIT_POLICY=PASSIVE: sf-trt gets --spin alike
    (a stand-in sf-trt records the command line it was given)."""
    import json
    import sys

    script = tmp_path / "fake_sf_trt.py"
    script.write_text(
        "import json, sys\n"
        "if sys.argv[1:3] == ['bench', '--help']:\n"
        "    print('--threads --ignore-eos --spin')\n"
        "else:\n"
        f"    open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "    print(json.dumps({'results': []}))\n"
    )
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    bench_peers = load_tool("bench_peers")
    doc, note = bench_peers.run_sf_trt([sys.executable, str(script)], [{"id": "a", "prompt_ids": [1, 2], "max_tokens": 1}], 2, False, 60)
    assert doc == {"results": []}
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert ("--spin" in argv) is spins and ("--spin" in note) is spins
    assert argv[argv.index("--threads") + 1] == "2" and "--ignore-eos" in argv


@pytest.mark.parametrize("has_repeats", [True, False])
def test_sf_trt_repeats_as_the_peers_do_or_the_run_says_its_sf_trt_cannot(load_tool, tmp_path, has_repeats):
    """``repeats`` > 1 reaches ``sf-trt bench --repeats`` (the fastest of them counts there, as for the
    peers); an sf-trt whose bench has no --repeats is not run, and the note says so."""
    import json
    import sys

    script = tmp_path / "fake_sf_trt.py"
    script.write_text(
        "import json, sys\n"
        "if sys.argv[1:3] == ['bench', '--help']:\n"
        f"    print('--threads --ignore-eos{' --repeats' if has_repeats else ''}')\n"
        "else:\n"
        f"    open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "    print(json.dumps({'results': []}))\n"
    )
    bench_peers = load_tool("bench_peers")
    doc, note = bench_peers.run_sf_trt([sys.executable, str(script)], [{"id": "a", "prompt_ids": [1, 2], "max_tokens": 1}], 2, False, 60,
                                       repeats=3)
    if has_repeats:
        argv = json.loads((tmp_path / "argv.json").read_text())
        assert doc == {"results": []} and argv[argv.index("--repeats") + 1] == "3"
    else:
        assert doc is None and "has no --repeats" in note and not (tmp_path / "argv.json").exists()


def test_bytes_per_token_count_every_weight_a_pass_reads_but_gathered_tables(load_tool, tiny_int8_model_dir, tmp_path):
    """sf_trt's int8 graph: everything but the float32 embedding (a pass gathers a row of it) is read per token;
    the tiny GGUF (tied: no output.weight) reads every tensor, its embedding as the output matrix."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from tiny_gguf import write_tiny_gguf

    bench_peers = load_tool("bench_peers")
    graph = tiny_int8_model_dir / "decoder_pass.onnx"
    got = bench_peers.onnx_bytes_per_token(graph)
    inits = {i.name: numpy_helper.to_array(i, base_dir=str(tiny_int8_model_dir)).nbytes for i in onnx.load(str(graph)).graph.initializer}
    assert got["gathered_tables_bytes"] > 0 and got["bytes_per_token"] + got["gathered_tables_bytes"] == sum(inits.values())
    cfg, weights = write_tiny_gguf(tmp_path / "t.gguf")
    tiny = bench_peers.gguf_bytes_per_token(tmp_path / "t.gguf")
    assert tiny["tied_embedding"] is True
    assert tiny["bytes_per_token"] == weights.tok_embd.nbytes + weights.output_norm.nbytes + sum(
        getattr(layer, f).nbytes for layer in weights.layers
        for f in ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down"))
    assert np.dtype(weights.tok_embd.dtype) == np.float32


def test_bytes_per_token_leave_out_a_table_gathered_through_a_reshape(load_tool, tiny_mixed_int4_model_dir):
    """A 4-bit graph's embedding is a Q8_0 table and its block scales, the scales reshaped to ``[V, nb, 1]``
    before the Gather: a pass reads a row of each, so neither counts as read per token (the lm_head's
    own matrix does)."""
    import onnx
    from onnx import numpy_helper

    bench_peers = load_tool("bench_peers")
    graph = tiny_mixed_int4_model_dir / "decoder_pass.onnx"
    got = bench_peers.onnx_bytes_per_token(graph)
    inits = {i.name: numpy_helper.to_array(i, base_dir=str(tiny_mixed_int4_model_dir)).nbytes for i in onnx.load(str(graph)).graph.initializer}
    assert got["bytes_per_token"] + got["gathered_tables_bytes"] == sum(inits.values())
    assert got["gathered_tables_bytes"] >= inits["tok_embd.q8"] + inits["tok_embd.scale"]
    assert got["bytes_per_token"] >= inits["lm_head.q4"] + inits["lm_head.scale"]


def test_the_triad_reports_the_bytes_it_moved(load_tool):
    bench_peers = load_tool("bench_peers")
    probe = bench_peers.machine_bandwidth(2, 1)
    assert probe["bytes_per_s"] == max(r["bytes_per_s"] for r in probe["runs"]) > 0
    assert [r["threads"] for r in probe["runs"]] == [1, 2]
    assert probe["runs"][1]["bytes_moved"] == 2 * bench_peers.TRIAD_ARRAYS_MOVED * (1 << 20)


def test_each_engines_decode_is_a_fraction_of_bandwidth_over_its_bytes_per_token(load_tool):
    """Decode-only where the first token's time is known (tokens after it over the seconds after it), end to
    end where not (HF); the limit is bandwidth / bytes per token."""
    bench_peers = load_tool("bench_peers")
    results = [{"peers": {"genai": {"plain": {"tokens": 11, "tokens_per_s": 11 / 2.0, "first_token_s": 1.0}},
                          "hf": {"plain": {"tokens": 10, "tokens_per_s": 5.0, "first_token_s": None}}}}]
    sf_doc = {"results": [{"plain": {"tokens": 21, "tokens_per_s": 21 / 3.0, "first_token_s": 1.0}}], "decode_tokens_per_s": {"plain": 10.0}}
    weights = {"genai": {"bytes_per_token": 100}, "hf": {"bytes_per_token": None}, "sf_trt": {"bytes_per_token": 200}}
    got = bench_peers.limit_report(results, sf_doc, weights, {"bytes_per_s": 1000.0})
    assert got["genai"] == {"tokens_per_s": 10.0, "rate": "decode only", "bytes_per_token": 100, "limit_tokens_per_s": 10.0,
                            "fraction_of_limit": 1.0}
    assert got["sf_trt"]["tokens_per_s"] == 10.0 and got["sf_trt"]["fraction_of_limit"] == 2.0
    assert got["hf"]["rate"].startswith("end to end") and got["hf"]["fraction_of_limit"] is None
    assert bench_peers.decode_rate(11, 2.0, 1.0) == 10.0 and bench_peers.decode_rate(1, 2.0, 1.0) is None


def test_genai_is_left_out_with_a_note_without_its_package_or_model(load_tool, tmp_path, capsys, monkeypatch):
    """The project never depends on onnxruntime-genai: without it (or without --genai-model) the peer is a note."""
    import importlib.util

    bench_peers = load_tool("bench_peers")
    args = bench_peers._parser().parse_args(["--peers", "genai"])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime_genai" else real(name, *a))
    with pytest.raises(bench_peers.Missing, match="genai: missing Python package.s. onnxruntime_genai"):
        bench_peers._open_peers(["genai"], tmp_path / "x.gguf", args)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "onnxruntime_genai" else real(name, *a))
    with pytest.raises(bench_peers.Missing, match=r"genai: no --genai-model DIR"):
        bench_peers._open_peers(["genai"], tmp_path / "x.gguf", args)


def test_a_first_token_time_past_a_rounded_runs_end_falls_back_to_the_end_to_end_rate(load_tool):
    """sf-trt bench rounds tokens/s: over a few tokens the first token's time can exceed tokens over that
    rate, which made the decode-only rate negative; the rate is then end to end, and says so."""
    bench_peers = load_tool("bench_peers")
    rate, how = bench_peers._overall_rate([{"tokens": 8, "tokens_per_s": 4.0, "first_token_s": 2.01}])
    assert rate == 4.0 and how.startswith("end to end")


def test_sf_trts_decode_rate_is_its_benchs_own_never_from_its_tick_late_first_token(load_tool):
    """sf-trt bench's first_token_s is the end of the first tick (16 tokens by default): (tokens - 1) over
    the time after it would overstate the rate, so without bench's own decode rate the rate is end to end."""
    bench_peers = load_tool("bench_peers")
    run = {"plain": {"tokens": 16, "tokens_per_s": 8.0, "first_token_s": 1.9}, "spec": {"tokens": 16, "tokens_per_s": 9.0}}
    assert bench_peers.sf_trt_decode_rate({"results": [run], "decode_tokens_per_s": {"plain": 12.5}})[0] == 12.5
    rate, how = bench_peers.sf_trt_decode_rate({"results": [run], "decode_tokens_per_s": {"plain": 15e9}})
    assert rate == 8.0 and how.startswith("end to end")
    # two runs together: tokens after the first over each run's decode time
    docs = [{"results": [run], "decode_tokens_per_s": {"plain": 15.0, "spec": 30.0}},
            {"results": [run, run], "decode_tokens_per_s": {"plain": 10.0, "spec": 15e9}}]
    got = bench_peers.combined_decode_rates(docs)
    assert got["plain"] == round(45 / (15 / 15.0 + 30 / 10.0), 2) and got["spec"] is None
