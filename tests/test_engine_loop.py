"""The engine loop (sf_trt/engine_loop.py): requests from threads and event loops, aborts,
backpressure, draining and faults; every request emits what it emits alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sf_trt.abi import Finish, Sampling, SamplingParams, Status, StatusError
from sf_trt.engine_loop import EngineLoop, LoopConfig, NotServing, Overloaded
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.generate import Generator
from sf_trt.scheduler import Request, SchedulerConfig
from sf_trt.tokenizer import ByteTokenizer

from fakes import POISON, FaultyFake, SlowFake

CFG = FakeConfig(vocab=257, eos=256, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=4, max_context=512, top_k_limit=16)
TOK = ByteTokenizer(257, 256)


def requests(n: int) -> list[Request]:
    out = []
    for i in range(n):
        text = ["ab ab ab", "the cat the cat", "xyz xy", "0101 0101"][i % 4] * (1 + i % 3)
        sampled = i % 2 == 1
        params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20 + 5 * i) if sampled else SamplingParams(max_tokens=20 + 5 * i)
        out.append(Request(TOK.encode(text), Sampling.GPU_GUMBEL if sampled else Sampling.GPU_GREEDY, params, seed=100 + i,
                           speculate=i % 3 != 0, stop=("cat t",) if i % 4 == 1 else (), logprobs=1 if i % 5 == 0 else None))
    return out


def alone(r: Request):
    from dataclasses import replace

    (res,) = Generator(FakePrimitives(CFG), tokenizer=TOK).run([replace(r, speculate=False)])
    return res


def collect(stream) -> tuple[list[int], str, object]:
    tokens, text, last = [], "", None
    for out in stream:
        tokens += out.tokens
        text += out.text or ""
        last = out
    return tokens, text, last


def test_requests_from_many_threads_each_get_what_they_get_alone():
    reqs = requests(12)
    with EngineLoop(SlowFake(CFG), tokenizer=TOK, config=LoopConfig(scheduler=SchedulerConfig.serving(tick_tokens=5))) as loop:
        results: dict[int, tuple] = {}

        def client(i):
            results[i] = collect(loop.submit(reqs[i], request_id=f"r{i}"))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert loop.executor.lanes == [] and loop.num_running == 0
    for i, r in enumerate(reqs):
        want = alone(r)
        tokens, text, last = results[i]
        assert tokens == want.tokens and text == want.text, i
        assert last.finish == want.finish and last.completion_tokens == len(tokens)
        assert last.stop_reason == want.stop_reason


def test_requests_from_an_event_loop_stream_asynchronously():
    reqs = requests(6)

    async def main(loop):
        async def one(r):
            tokens = []
            async for out in loop.submit(r):
                tokens += out.tokens
            return tokens

        return await asyncio.wait_for(asyncio.gather(*(one(r) for r in reqs)), 60)

    with EngineLoop(FakePrimitives(CFG), tokenizer=TOK) as loop:
        got = asyncio.run(main(loop))
    assert got == [alone(r).tokens for r in reqs]


def test_abort_frees_the_lane_within_a_tick_and_ends_the_stream():
    with EngineLoop(SlowFake(CFG), tokenizer=TOK) as loop:
        r = Request(TOK.encode("abc abc"), params=SamplingParams(max_tokens=400), speculate=False)
        stream = loop.submit(r, request_id="long")
        it = iter(stream)
        first = next(it)
        assert first.tokens and loop.abort("long")
        rest = list(it)
        assert rest[-1].finish == Finish.ABORTED and rest[-1].error is None
        assert first.completion_tokens + sum(len(o.tokens) for o in rest) < 400
        deadline = time.monotonic() + 5
        while loop.executor.lanes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.executor.lanes == []
        assert not loop.abort("long")  # no longer live


def test_a_full_queue_refuses_with_overloaded_and_loses_nothing_below_it():
    cfg = CFG.__class__(**{**CFG.__dict__, "max_lanes": 1})
    with EngineLoop(SlowFake(cfg), tokenizer=TOK, config=LoopConfig(max_queued=2)) as loop:
        r = Request(TOK.encode("abcd"), params=SamplingParams(max_tokens=60), speculate=False)
        first = loop.submit(r)
        next(iter(first))  # running
        queued = [loop.submit(r), loop.submit(r)]
        with pytest.raises(Overloaded, match=r"2 requests are waiting for a lane \(--max-queued-requests 2\)"):
            loop.submit(r)
        outs = [collect(s) for s in queued]
        assert all(o[2].finish == Finish.LENGTH and len(o[0]) == 60 for o in outs)


@pytest.mark.parametrize("max_queued", [0, 1])
def test_the_queue_limit_counts_only_requests_that_no_free_lane_awaits(max_queued):
    """4 lanes: 4 requests submitted at once to an idle loop all run, whatever the
    limit (0 included); then ``max_queued`` more may wait, and the next is refused."""
    with EngineLoop(SlowFake(CFG), tokenizer=TOK, config=LoopConfig(max_queued=max_queued)) as loop:
        assert loop.capacity == 4 + max_queued
        r = Request(TOK.encode("abcd"), params=SamplingParams(max_tokens=40), speculate=False)
        streams = [loop.submit(r) for _ in range(4 + max_queued)]  # faster than the loop admits them
        with pytest.raises(Overloaded, match=rf"{max_queued} requests are waiting for a lane \(--max-queued-requests {max_queued}\)"):
            loop.submit(r)
        outs = [collect(s) for s in streams]
        assert all(o[2].finish == Finish.LENGTH and len(o[0]) == 40 for o in outs)


def test_bad_requests_are_refused_at_submit_with_their_status():
    with EngineLoop(FakePrimitives(CFG), tokenizer=TOK) as loop:
        for request, status in (
            (Request([]), Status.EMPTY_PROMPT),
            (Request([1] * 600), Status.PROMPT_TOO_LONG),
            (Request([999]), Status.TOKEN_OUT_OF_VOCAB),
            (Request([1], Sampling.GPU_GUMBEL, SamplingParams(temperature=0.0)), Status.BAD_SAMPLING_PARAMS),
        ):
            with pytest.raises(StatusError) as err:
                loop.submit(request)
            assert err.value.status == status
        assert loop.num_waiting == 0


def test_drain_ends_queued_requests_at_once_and_running_ones_at_the_deadline():
    cfg = CFG.__class__(**{**CFG.__dict__, "max_lanes": 2})
    loop = EngineLoop(SlowFake(cfg), tokenizer=TOK).start()
    short = Request(TOK.encode("ab"), params=SamplingParams(max_tokens=10), speculate=False)
    long = Request(TOK.encode("ab"), params=SamplingParams(max_tokens=500), speculate=False)
    streams = [loop.submit(short), loop.submit(long), loop.submit(long)]
    next(iter(streams[1]))  # both lanes run
    t0 = time.monotonic()
    loop.drain(0.5)
    with pytest.raises(NotServing, match="shutting down"):
        loop.submit(short)
    outs = [collect(s)[2] for s in streams]
    assert outs[0].finish == Finish.LENGTH  # finished within the timeout
    assert outs[1].finish == Finish.ERROR and "cut at the drain timeout" in outs[1].error
    assert outs[2].finish == Finish.ERROR and "had not started" in outs[2].error
    assert time.monotonic() - t0 < 5
    loop.shutdown(1.0)
    assert not loop._thread.is_alive()


def test_a_failed_tick_ends_its_requests_with_an_error_and_the_loop_goes_on():
    prims = FaultyFake(CFG)
    with EngineLoop(prims, tokenizer=TOK) as loop:
        _, _, bad = collect(loop.submit(Request([1, 2, POISON, 3], params=SamplingParams(max_tokens=8))))
        assert bad.finish == Finish.ERROR and "injected fault" in bad.error
        tokens, _, ok = collect(loop.submit(Request([1, 2, 3], params=SamplingParams(max_tokens=8))))
        assert ok.finish == Finish.LENGTH and len(tokens) == 8
        # a backend that cannot even release: the request ends with the error and its slot is
        # quarantined (docs/errors.md); once the backend recovers, the slot is freed and the loop serves on
        prims.broken = True
        _, _, dead = collect(loop.submit(Request([1, 2, 3], params=SamplingParams(max_tokens=8))))
        assert dead.finish == Finish.ERROR and "injected fault" in dead.error
        prims.broken = False
        again, _, fine = collect(loop.submit(Request([1, 2, 3], params=SamplingParams(max_tokens=8))))
        assert fine.finish == Finish.LENGTH and again == tokens and loop.serving


def test_a_request_is_checked_once_on_its_way_in(monkeypatch):
    """The door (EngineLoop.check, or the caller's check with checked=True) checks a request;
    the loop thread queues it without checking it again."""
    from sf_trt.scheduler import Scheduler

    calls = []
    real = Scheduler.check
    monkeypatch.setattr(Scheduler, "check", lambda self, request, name="request": calls.append(name) or real(self, request, name))
    with EngineLoop(FakePrimitives(CFG), tokenizer=TOK) as loop:
        outs = list(loop.submit(Request([1, 2, 3], params=SamplingParams(max_tokens=4), speculate=False)))
        assert outs[-1].finished and len(calls) == 1
        loop.check(req := Request([4, 5, 6], params=SamplingParams(max_tokens=4), speculate=False))
        outs = list(loop.submit(req, checked=True))
        assert outs[-1].finished and len(calls) == 2
