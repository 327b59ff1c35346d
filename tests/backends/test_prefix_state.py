"""The prefix cache on the onnxruntime decoder: a cached block's K/V bytes are a fresh prefill's,
and a turn that starts from the cache emits what it emits without it (tiny model and real)."""

from __future__ import annotations

import numpy as np
import pytest

from sf_trt.abi import Sampling, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.primitives import Rows
from sf_trt.testing import Harness

from lanes import LaneSpec, run_lanes

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def fresh_kv(model_dir, tokens: list[int], max_context: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of ``tokens`` prefilled in one pass on a decoder of its own."""
    with OrtDecoderPrimitives(model_dir, max_lanes=1, max_context=max_context) as prims:
        n = len(tokens)
        prims.forward(Rows(np.zeros(n, np.int64), np.arange(n), np.asarray(tokens, np.int64), np.zeros(0, np.int64)))
        return prims.cache_rows(0)


def assert_cached_blocks_are_fresh_bytes(ex: Executor, model_dir, tokens: list[int], max_context: int, scope: str = "") -> int:
    """Every block the cache holds for ``tokens`` against a fresh prefill; how many there were."""
    chain = ex.prefix_cache.match(scope, tokens, len(tokens))
    keys, values = fresh_kv(model_dir, tokens, max_context)
    pool_keys, pool_values = ex.primitives.block_pool.arrays
    for block in chain:
        k, v = pool_keys[block.index], pool_values[block.index]
        end = block.start + ex.prefix_cache.block_tokens
        assert np.array_equal(bits(k), bits(keys[:, :, block.start:end])), f"keys of block at {block.start}"
        assert np.array_equal(bits(v), bits(values[:, :, block.start:end])), f"values of block at {block.start}"
    return len(chain)


def two_turns(make, model_dir, turn1: list[int], new: list[int], *, mode, params, speculate, max_context):
    """Turn 1, then turn 2 (turn 1, its reply and ``new``) admitted after it ended: the runs with the
    cache on and off, the positions turn 2 took from the cache, and the executor that cached."""
    reply = run_lanes(make, [LaneSpec(tuple(turn1), mode=mode, params=params, seed=9, budgets=(24,))])[0].tokens
    lanes = [
        LaneSpec(tuple(turn1), mode=mode, params=params, seed=9, speculate=speculate, prefill_chunk=7, budgets=(24,)),
        LaneSpec(tuple(turn1 + reply + new), mode=mode, params=params, seed=4, speculate=speculate, admit_tick=12, budgets=(20,)),
    ]
    ex = Executor(make(), ExecutorConfig(prefix_cache_mb=64))
    cached: dict[int, int] = {}
    on = run_lanes(make, lanes, harness=Harness.with_engine(ex), cached=cached)
    off = run_lanes(make, lanes)
    return on, off, cached[1], ex, turn1 + reply


@pytest.mark.parametrize("speculate", [False, True])
@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_tiny_second_turn_from_the_cache_is_exact(tiny_model_dir, mode, speculate):
    rng = np.random.default_rng(3)
    stem = rng.integers(0, 256, 12).tolist()
    turn1 = stem * 3 + rng.integers(0, 256, 5).tolist()  # repeats: prompt lookup drafts, and some drafts are rolled back
    params = SAMPLED if mode == Sampling.GPU_GUMBEL else SamplingParams()

    def make():
        return OrtDecoderPrimitives(tiny_model_dir, max_lanes=2, max_context=128)

    on, off, cached, ex, history = two_turns(make, tiny_model_dir, turn1, [1, 2, 3], mode=mode, params=params, speculate=speculate, max_context=128)
    assert [r.tokens for r in on] == [r.tokens for r in off]
    assert cached == (len(history) - 1) // 16 * 16 and cached >= 48
    # the blocks turn 1 left (prompt prefilled in chunks of 7, reply decoded with drafts) and turn 2 added
    assert assert_cached_blocks_are_fresh_bytes(ex, tiny_model_dir, history + [1, 2, 3] + on[1].tokens, 128) >= 4


def test_tiny_whole_prompt_cached_computes_the_last_row(tiny_model_dir):
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, 256, 33).tolist()  # 32 positions cached, the last token forwarded by the decode

    def make():
        return OrtDecoderPrimitives(tiny_model_dir, max_lanes=2, max_context=96)

    lanes = [LaneSpec(tuple(prompt), budgets=(10,)), LaneSpec(tuple(prompt), admit_tick=3, budgets=(10,))]
    cached: dict[int, int] = {}
    on = run_lanes(make, lanes, executor_config=ExecutorConfig(prefix_cache_mb=8), cached=cached)
    assert cached[1] == 32
    assert on[1].tokens == on[0].tokens == run_lanes(make, lanes[:1])[0].tokens


@pytest.mark.slow
@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_real_second_turn_from_the_cache_is_exact(real_model_dir, real_tokenizer, mode):
    chat = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "List three facts about the Moon, then three about Mars, in short sentences.<|im_end|>\n<|im_start|>assistant\n"
    )
    turn1 = real_tokenizer.encode(chat)
    new = real_tokenizer.encode("<|im_end|>\n<|im_start|>user\nNow the same for Venus.<|im_end|>\n<|im_start|>assistant\n")
    params = SAMPLED if mode == Sampling.GPU_GUMBEL else SamplingParams()

    def make():
        return OrtDecoderPrimitives(real_model_dir, max_lanes=2, max_context=256)

    on, off, cached, ex, history = two_turns(make, real_model_dir, turn1, new, mode=mode, params=params, speculate=True, max_context=256)
    assert [r.tokens for r in on] == [r.tokens for r in off]
    assert cached == (len(history) - 1) // 16 * 16 and cached >= 48
    assert assert_cached_blocks_are_fresh_bytes(ex, real_model_dir, history, 256) >= cached // 16


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_tiny_a_prefix_still_being_prefilled_by_another_lane(tiny_model_dir, mode):
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 256, 60).tolist()
    params = SAMPLED if mode == Sampling.GPU_GUMBEL else SamplingParams()

    def make():
        return OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=128)

    lanes = [
        LaneSpec(tuple(prompt), mode=mode, params=params, seed=1, prefill_chunk=8, budgets=(12,)),
        LaneSpec(tuple(prompt + [7, 8]), mode=mode, params=params, seed=2, admit_tick=3, prefill_chunk=8, budgets=(12,), speculate=True),
        LaneSpec(tuple(prompt[:33]), mode=mode, params=params, seed=3, admit_tick=5, budgets=(12,)),
    ]
    cached: dict[int, int] = {}
    on = run_lanes(make, lanes, executor_config=ExecutorConfig(prefix_cache_mb=16), cached=cached)
    assert cached == {0: 0, 1: 16, 2: 32}  # lane 0's blocks as its chunks of 8 completed them
    assert [r.tokens for r in on] == [r.tokens for r in run_lanes(make, lanes)]
