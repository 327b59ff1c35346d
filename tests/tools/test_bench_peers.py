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
