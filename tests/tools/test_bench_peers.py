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
