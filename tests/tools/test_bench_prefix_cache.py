"""tools/bench_prefix_cache.py's parts that need no server: conversations grow deterministically, per kind."""

from __future__ import annotations


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
