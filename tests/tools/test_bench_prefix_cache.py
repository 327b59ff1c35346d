"""tools/bench_prefix_cache.py's parts that need no server: conversations grow deterministically, per kind."""

from __future__ import annotations

import pytest


def test_conversations_are_deterministic_and_grow_a_turn_at_a_time(load_tool):
    tool = load_tool("bench_prefix_cache")
    a, b = (tool.Conversation("agent", seed=3, turn_words=40, user="u") for _ in range(2))
    chat = tool.Conversation("chat", seed=3, turn_words=40, user="u")
    for conv in (a, b, chat):
        conv.next_turn()
        conv.next_turn()
    assert a.messages == b.messages and len(a.messages) == 3
    assert a.messages[1]["content"].startswith("Observation from list_files():\n{")
    assert chat.messages[1]["content"].startswith("Here is more context. ") and len(chat.messages[1]["content"].split()) >= 40


def test_per_turn_takes_the_median_over_the_conversations_of_a_kind(load_tool):
    tool = load_tool("bench_prefix_cache")
    result = {"kinds": ["chat", "agent", "chat"],
              "turns": [[{"ttft_s": 1.0}, {"ttft_s": 2.0}], [{"ttft_s": 9.0}, {"ttft_s": 9.0}], [{"ttft_s": 3.0}, {"ttft_s": 4.0}]]}
    assert tool.per_turn(result, "chat", "ttft_s") == [2.0, 3.0]


def test_a_turn_not_run_is_nan_in_the_medians(load_tool):
    tool = load_tool("bench_prefix_cache")
    result = {"kinds": ["tokens"], "turns": [[{"ttft_s": 1.0}, None, {"ttft_s": 3.0}]]}
    got = tool.per_turn(result, "tokens", "ttft_s")
    assert got[0] == 1.0 and got[1] != got[1] and got[2] == 3.0


def test_token_conversations_are_deterministic_and_take_their_replies(load_tool):
    tool = load_tool("bench_prefix_cache")
    a, b = (tool.TokenConversation(5, 10, "u", range(4, 100)) for _ in range(2))
    for conv in (a, b):
        conv.next_turn()
        conv.add_reply([1, 2])
        conv.next_turn()
    assert a.tokens == b.tokens and len(a.tokens) == 22 and a.tokens[10:12] == [1, 2]
    assert all(4 <= t < 100 for t in a.tokens[:10] + a.tokens[12:])


def test_the_predicted_cost_counts_new_rows_over_weights_and_keys(load_tool):
    from types import SimpleNamespace

    tool = load_tool("bench_prefix_cache")
    cfg = SimpleNamespace(n_layers=1, hidden=2, n_heads=1, n_kv_heads=1, head_dim=2, ffn=3)
    weights = 2 * (2 * (2 + 4) + 2 * 2 + 3 * 2 * 3)  # q, k, v; o; gate, up, down: 2 FLOPs a weight
    assert tool.predicted_cost(cfg, [10, 30], [0, 16]) == [10 * (weights + 8 * 10), 14 * (weights + 8 * 30)]
    with pytest.raises(SystemExit):
        tool.main(["--off-turns", "1,9", "--turns", "8"])
