"""The prefix cache: its index (blocks, LRU, budget, pins, scopes) and the executor's use of it
on the fake, where output with the cache on must equal output with it off, token for token."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sf_trt.abi import Finish, Sampling, SamplingParams, Status, StatusError
from sf_trt.engine import Plan
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.block_pool import BlockPool
from sf_trt.prefix_cache import BLOCK_TOKENS, PrefixCache
from sf_trt.testing import Harness

from lanes import LaneSpec, run_lanes

B = BLOCK_TOKENS
CFG = FakeConfig(vocab=24, eos=23, copy_model=True, verify_rows=True, max_lanes=6, max_context=128, max_rows_per_pass=96, top_k_limit=16)
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


def pool(blocks: int) -> BlockPool:
    """A pool of ``blocks`` blocks of B int64 positions (the fake's state)."""
    return BlockPool(blocks, B, [((B,), np.int64)])


def saver(log: list):
    def save(start: int, index: int) -> bool:
        log.append(start)
        return True
    return save


# -- the index -----------------------------------------------------------------------------------


def test_a_chain_is_found_block_by_block_and_only_in_its_scope():
    cache = PrefixCache(pool(100))
    tokens = list(range(50))
    chain = cache.extend("a", [], tokens, 50, saver(read := []))
    assert read == [0, 16, 32] and len(chain) == 3
    assert cache.cached_len("a", tokens, 49) == 48
    assert cache.cached_len("a", tokens, 47) == 32  # whole blocks within the limit only
    assert cache.cached_len("a", tokens[:20] + [99] + tokens[21:], 49) == 16  # a changed token ends the match
    assert cache.cached_len("b", tokens, 49) == 0
    assert cache.cached_len(None, tokens, 49) == 0
    assert cache.extend(None, [], tokens, 50, saver(none := [])) == [] and none == []
    again = cache.extend("a", [], tokens, 50, saver(twice := []))
    assert twice == [] and [b.block_id for b in again] == [b.block_id for b in chain]  # adopted, not read again
    assert [b.refs for b in chain] == [2, 2, 2]
    cache.check_integrity()


def test_eviction_takes_least_recently_used_leaves_and_never_a_pinned_block():
    cache = PrefixCache(pool(4))  # four blocks
    old = cache.extend("", [], [1] * 32, 32, saver([]))
    new = cache.extend("", [], [2] * 32, 32, saver([]))
    cache.unpin(old)
    cache.unpin(new)
    cache.match("", [1] * 32, 32)  # old is now the more recently used
    pinned = cache.extend("", [], [3] * 32, 32, saver([]))
    assert cache.cached_len("", [2] * 33, 32) == 0 and cache.cached_len("", [1] * 33, 32) == 32
    assert cache.evictions == 2
    # every block pinned or a parent: a new block is not kept, nothing pinned is taken
    cache.pin(cache.match("", [1] * 32, 32))
    assert cache.extend("", [], [4] * 32, 32, saver(read := [])) == [] and read == []
    assert cache.cached_len("", [3] * 33, 32) == 32 and len(pinned) == 2
    assert cache.bytes <= cache.budget_bytes
    cache.check_integrity()


def test_a_parent_outlives_its_children():
    cache = PrefixCache(pool(3))
    chain = cache.extend("", [], list(range(48)), 48, saver([]))
    cache.unpin(chain)
    cache.extend("", [], [7] * 16, 16, saver([]))  # room for one: the deepest block goes first
    assert cache.cached_len("", list(range(48)) + [0], 48) == 32
    cache.check_integrity()


def test_blocks_take_pool_slots_and_eviction_gives_them_back():
    cache = PrefixCache(pool(2))
    first = cache.extend("", [], list(range(32)), 32, saver([]))
    assert sorted(b.index for b in first) == [0, 1] and cache.pool.used == 2 and cache.bytes == 2 * B * 8
    cache.unpin(first)
    second = cache.extend("", [], [5] * 16, 16, saver([]))  # the leaf of the first chain goes, its slot is reused
    assert second[0].index == first[1].index and cache.evictions == 1 and cache.pool.used == 2
    failed = cache.extend("", [], [6] * 16, 16, lambda start, index: False)  # the first chain's root goes for it
    assert failed == [] and cache.evictions == 2 and cache.pool.used == 1  # and a failed save keeps no slot
    third = cache.extend("", [], [7] * 16, 16, saver([]))
    assert cache.extend("", [], [8] * 16, 16, saver(tried := [])) == [] and tried == []  # both pinned: nothing to evict
    assert cache.pool.used == 2 and {second[0].index, third[0].index} == {0, 1}
    cache.check_integrity()


def test_integrity_catches_a_slot_the_books_do_not_hold():
    cache = PrefixCache(pool(3))
    cache.extend("", [], list(range(16)), 16, saver([]))
    cache.pool.take()
    with pytest.raises(AssertionError, match=r"prefix cache: 1 blocks, 2 pool slots taken"):
        cache.check_integrity()
    with pytest.raises(ValueError, match=r"PrefixCache: a pool of 384 bytes for a budget of 100"):
        PrefixCache(pool(3), 100)


# -- the executor on the fake ----------------------------------------------------------------------


def fake():
    return FakePrimitives(CFG)


ON = ExecutorConfig(prefix_cache_mb=1)


def spec(prompt, **kw) -> LaneSpec:
    return LaneSpec(tuple(prompt), **kw)


def test_a_second_turn_starts_from_the_first_and_emits_the_same_tokens():
    rng = np.random.default_rng(1)
    turn1 = rng.integers(0, 22, 40).tolist()
    reply = run_lanes(fake, [spec(turn1, budgets=(12,))])[0].tokens
    lanes = [spec(turn1, budgets=(12,)), spec(turn1 + reply + [3, 4, 5], admit_tick=3, budgets=(12,))]
    cached: dict[int, int] = {}
    on = run_lanes(fake, lanes, executor_config=ON, cached=cached)
    off = run_lanes(fake, lanes)
    assert [r.tokens for r in on] == [r.tokens for r in off]
    assert cached == {0: 0, 1: 48}  # turn 1's prompt and output, whole blocks


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_a_whole_prompt_cached_still_computes_its_last_row(mode):
    prompt = list(range(1, 23)) + list(range(1, 12))  # 33 tokens: 32 positions cached, the last token is the decode's row
    params = SAMPLED if mode == Sampling.GPU_GUMBEL else SamplingParams()
    lanes = [spec(prompt, mode=mode, params=params, seed=5), spec(prompt, mode=mode, params=params, seed=5, admit_tick=2)]
    cached: dict[int, int] = {}
    on = run_lanes(fake, lanes, executor_config=ON, cached=cached)
    assert cached[1] == len(prompt) - 1
    assert on[0].tokens == on[1].tokens == run_lanes(fake, lanes[:1])[0].tokens


def test_a_prefix_still_being_prefilled_by_another_lane():
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, 23, 70).tolist()
    lanes = [spec(prompt, prefill_chunk=16), spec(prompt + [1, 2], admit_tick=2, prefill_chunk=16, speculate=True)]
    cached: dict[int, int] = {}
    on = run_lanes(fake, lanes, executor_config=ON, cached=cached)
    assert cached[1] == 32  # lane 0's first two chunks, saved as they were prefilled
    assert [r.tokens for r in on] == [r.tokens for r in run_lanes(fake, lanes)]


def test_scopes_do_not_share_and_none_keeps_nothing():
    prompt = [t % 20 for t in range(40)]
    h_lanes = [spec(prompt, scope="a"), spec(prompt, scope="b", admit_tick=2), spec(prompt, scope=None, admit_tick=4),
               spec(prompt, scope="a", admit_tick=6)]
    cached: dict[int, int] = {}
    run_lanes(fake, h_lanes, executor_config=ON, cached=cached)
    assert cached == {0: 0, 1: 0, 2: 0, 3: 32}


def test_hits_and_queries_are_counted_in_tokens():
    ex = Executor(fake(), ON)
    p = ex.register_prompt([t % 20 for t in range(40)])
    ex.tick(Plan().admit(1, p).prefill(1, 0, 40).decode(1, 1).release(1))
    c = ex.cached_prefix(p, "")
    ex.tick(Plan().admit(2, p, cached_len=c).prefill(2, c, 40 - c).decode(2, 1))
    assert (ex.prefix_queries, ex.prefix_hits) == (80, 32)
    ex.check_integrity()


def test_the_executor_keeps_its_blocks_in_a_pool_opened_once_within_the_budget():
    prims = fake()
    ex = Executor(prims, ON)
    pool = prims.block_pool
    assert ex.prefix_cache.pool is pool and pool.capacity == (1 << 20) // (B * 8) and pool.nbytes <= ex.prefix_cache.budget_bytes
    ex.prefix_cache = PrefixCache(prims.open_block_pool(2 * B * 8, B))  # two blocks: every new prompt evicts
    arrays = prims.block_pool.arrays
    rng = np.random.default_rng(7)
    for lane in range(1, 7):
        p = ex.register_prompt(rng.integers(0, 22, 40).tolist())
        ex.tick(Plan().admit(lane, p).prefill(lane, 0, 40).decode(lane, 1).release(lane))
        ex.check_integrity()
        assert prims.block_pool.used == len(ex.prefix_cache) == 2
    assert prims.block_pool.arrays is arrays and ex.prefix_cache.evictions == 10


def test_a_backend_that_cannot_hold_state_refuses_a_prefix_cache():
    prims = fake()
    prims.capabilities = dataclasses.replace(prims.capabilities, state_bytes_per_token=0)
    with pytest.raises(StatusError, match=r"Executor: prefix_cache_mb 1 asks for a prefix cache, and FakePrimitives cannot save or load state") as err:
        Executor(prims, ON)
    assert err.value.status == Status.UNSUPPORTED
    for call, op in ((lambda: prims.open_block_pool(1 << 20, B), r"open_block_pool\(budget_bytes=1048576, block_tokens=16\)"),
                     (lambda: prims.save_block(0, 0, 1), r"save_block\(lane=0, start=0, index=1\)")):
        with pytest.raises(StatusError, match=op + ": FakePrimitives cannot save or load state") as err:
            call()
        assert err.value.status == Status.UNSUPPORTED


def test_state_io_is_checked_at_the_seam():
    prims = fake()
    with pytest.raises(StatusError, match=r"save_block\(lane=0, start=0, index=0\): no block pool \(open_block_pool first\)"):
        prims.save_block(0, 0, 0)
    pool = prims.open_block_pool(2 * B * 8, B)
    taken = pool.take()
    with pytest.raises(StatusError, match=r"save_block\(lane=0, start=0, index=0\): a block of 16 positions from 0 is outside the state's 0 positions"):
        prims.save_block(0, 0, taken)
    with pytest.raises(StatusError, match=r"load_prefix\(lane=0, 2 blocks\): block 1 is not a taken slot of the pool \(1 of 2 taken\)") as err:
        prims.load_prefix(0, [taken, 1])
    assert err.value.status == Status.BAD_ARGUMENT and prims.state_len(0) == 0
    prims.load_prefix(0, [taken])
    assert prims.state_len(0) == B
    with pytest.raises(StatusError, match=r"load_prefix\(lane=0, 1 blocks\): the slot holds 16 positions \(it must be empty\)"):
        prims.load_prefix(0, [taken])


def test_a_failed_prefix_load_ends_that_lane_only():
    class FailingLoad(FakePrimitives):
        def _load_prefix_impl(self, lane, blocks):
            raise RuntimeError("no room on the device")

    ex = Executor(FailingLoad(CFG), ON)
    p = ex.register_prompt([t % 20 for t in range(40)])
    ex.tick(Plan().admit(1, p).prefill(1, 0, 40).decode(1, 2).release(1))
    other = ex.register_prompt([5, 6, 7])
    c = ex.cached_prefix(p, "")
    ev = ex.tick(Plan().admit(2, p, cached_len=c).prefill(2, c, 40 - c).decode(2, 3).admit(3, other).prefill(3, 0, 3).decode(3, 3))
    assert ev.emit_for(2).finish == Finish.ERROR and "prefix load (lane 2): RuntimeError: no room on the device" in ev.emit_for(2).error
    assert ev.emit_for(3).finish == Finish.NONE and len(ex.read_tokens(ev.emit_for(3).token_ref)) == 3
    ex.check_integrity()


# -- random schedules ----------------------------------------------------------------------------------


@st.composite
def schedules(draw):
    stems = [draw(st.lists(st.integers(0, 22), min_size=20, max_size=60)) for _ in range(2)]
    lanes = []
    for _ in range(draw(st.integers(2, 6))):
        stem = stems[draw(st.integers(0, 1))]
        prompt = stem[: draw(st.integers(len(stem) // 2, len(stem)))] + draw(st.lists(st.integers(0, 22), max_size=20))
        sampled = draw(st.booleans())
        lanes.append(spec(
            prompt or [1],
            mode=Sampling.GPU_GUMBEL if sampled else Sampling.GPU_GREEDY,
            params=SAMPLED if sampled else SamplingParams(),
            seed=draw(st.integers(0, 3)),
            speculate=draw(st.booleans()),
            admit_tick=draw(st.integers(0, 10)),
            prefill_chunk=draw(st.sampled_from([1, 7, 16, 64])),
            budgets=tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))),
            scope=draw(st.sampled_from(["", "", "t", None])),
        ))
    budget_mb = draw(st.sampled_from([1, 0]))  # 0: a budget of a few blocks (below)
    return lanes, budget_mb


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules())
def test_random_schedules_emit_the_same_with_the_cache_on(case):
    lanes, budget_mb = case
    ex = Executor(fake(), ExecutorConfig(prefix_cache_mb=1))
    if budget_mb == 0:  # a cache of three blocks (the fake holds 8 bytes a position): eviction on nearly every save
        ex.prefix_cache = PrefixCache(ex.primitives.open_block_pool(3 * B * 8, B))
    cached: dict[int, int] = {}
    got = run_lanes(fake, lanes, harness=Harness.with_engine(ex), cached=cached)
    want = run_lanes(fake, lanes)
    event(f"lanes starting from a cached prefix: {sum(1 for c in cached.values() if c)}")
    assert [(r.tokens, r.finish) for r in got] == [(r.tokens, r.finish) for r in want]


def test_the_scheduler_starts_requests_from_the_cache_and_they_emit_the_same():
    """Through the scheduler: a second turn, and a request that arrives while another is still
    prefilling the same prefix, greedy and sampled, speculating with either drafter."""
    from sf_trt.scheduler import Request, Scheduler, SchedulerConfig

    rng = np.random.default_rng(5)
    stem = [int(t) for t in rng.integers(0, 22, 64)]

    def run_to_completion(sched: Scheduler) -> None:
        while sched.has_work:
            sched.step()

    def run(mb: int) -> tuple[list[list[int]], list]:
        sched = Scheduler(Executor(fake(), ExecutorConfig(prefix_cache_mb=mb)), SchedulerConfig(tick_tokens=4, prefill_chunk=16, prefill_budget=16))
        sampled = dict(sampling=Sampling.GPU_GUMBEL, params=SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12), seed=3)
        first = sched.add(Request(stem, params=SamplingParams(max_tokens=12), drafter="suffix"), 1)
        sched.step()
        sched.step()  # the first is half prefilled when these arrive
        later = [sched.add(Request(stem + [1, 2], **sampled), 2), sched.add(Request(stem[:40], speculate=False, params=SamplingParams(max_tokens=12)), 3)]
        run_to_completion(sched)
        turn2 = sched.add(Request(stem + first.tokens + [4, 5, 6], params=SamplingParams(max_tokens=12)), 4)
        run_to_completion(sched)
        seqs = [first, *later, turn2]
        sched.executor.check_integrity()
        return [s.tokens for s in seqs], [s.cached_len for s in seqs]

    tokens_on, cached = run(1)
    tokens_off, none = run(0)
    assert tokens_on == tokens_off
    assert none == [None] * 4
    assert cached[0] == 0 and cached[1] == 32 and cached[2] == 32 and cached[3] == (64 + 12 - 1) // 16 * 16


def test_a_failed_prefix_save_ends_that_lane_only_and_keeps_nothing_of_it():
    class FailingSave(FakePrimitives):
        def _save_block_impl(self, lane, start, length):
            if self._history[lane, 0] == 7:
                raise RuntimeError("device read failed")
            return super()._save_block_impl(lane, start, length)

    ex = Executor(FailingSave(CFG), ON)
    bad, good = ex.register_prompt([7] + [1] * 39), ex.register_prompt([5] + [1] * 39)
    ev = ex.tick(Plan().admit(1, bad).prefill(1, 0, 40).decode(1, 3).admit(2, good).prefill(2, 0, 40).decode(2, 3))
    assert ev.emit_for(1).finish == Finish.ERROR and "prefix save (lane 1): RuntimeError: device read failed" in ev.emit_for(1).error
    assert ev.emit_for(2).finish == Finish.NONE and len(ex.read_tokens(ev.emit_for(2).token_ref)) == 3
    assert ex.cached_prefix(ex.register_prompt([7] + [1] * 39), "") == 0 and ex.cached_prefix(ex.register_prompt([5] + [1] * 39), "") == 32
    ex.check_integrity()


def test_a_lane_asking_for_prompt_logprobs_cannot_start_from_the_cache():
    """Prompt logprobs come from the prefill's own rows: a lane that skipped positions
    would miss theirs, so the executor refuses the pair and names both."""
    ex = Executor(fake(), ON)
    h = Harness.with_engine(ex)
    p = h.prompt([t % 20 for t in range(40)])
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 40).decode(1, 1).release(1))
    c = ex.cached_prefix(p, "")
    assert c == 32
    with pytest.raises(StatusError, match=r"admit\(lane=2\): prompt_logprobs 3 scores every prompt position in the prefill, "
                       r"and cached_len 32 skips the first of them \(admit it with cached_len=0\)") as err:
        ex.tick(Plan().admit(2, p, cached_len=c, prompt_logprobs=3))
    assert err.value.status == Status.BAD_ARGUMENT
    ex.check_integrity()


def test_the_scheduler_prefills_a_prompt_logprobs_request_whole_and_its_logprobs_are_the_plain_ones():
    """With the cache holding the prompt, a request for prompt logprobs still prefills all of
    it (cached_tokens 0) and gets every prompt token's logprobs, the same as with the cache
    off; a plain request beside it takes the cached prefix."""
    from sf_trt.generate import Generator
    from sf_trt.scheduler import Request

    prompt = [t % 20 for t in range(40)]
    params = SamplingParams(max_tokens=6)

    def run(mb: int):
        gen = Generator(fake(), executor_config=ExecutorConfig(prefix_cache_mb=mb), prefill_chunk=16)
        (first,) = gen.run([Request(prompt, params=params)])
        scored, plain = gen.run([Request(prompt, params=params, prompt_logprobs=4), Request(prompt, params=params)])
        return first, scored, plain

    first, scored, plain = run(1)
    off_first, off_scored, off_plain = run(0)
    assert (first.cached_tokens, scored.cached_tokens, plain.cached_tokens) == (0, 0, 32)
    assert (off_first.cached_tokens, off_scored.cached_tokens, off_plain.cached_tokens) == (None, None, None)
    assert [r.tokens for r in (first, scored, plain)] == [r.tokens for r in (off_first, off_scored, off_plain)]
    assert len(scored.prompt_logprobs.logprob) == len(prompt) - 1
    for name in ("logprob", "top_ids", "top_logprobs"):
        np.testing.assert_array_equal(getattr(scored.prompt_logprobs, name), getattr(off_scored.prompt_logprobs, name), err_msg=name)
