"""The decoder on onnxruntime (sf_trt.backends.ort_decoder): packing, rollback, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from rows import SEQ, bits, close_to_reference, concat, rows
from sf_trt.export.reference import reference_forward

from sf_trt.abi import Status, StatusError
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.primitives import SampleRows


@pytest.fixture
def prims(tiny_model_dir):
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, threads=1)
    yield p
    p.close()


def test_int8_below_extended_optimization_is_refused(tiny_int8_model_dir):
    with pytest.raises(StatusError, match="'basic' with int8 weights: rows would not be exact"):
        OrtDecoderPrimitives(tiny_int8_model_dir, max_context=64, optimization="basic")


def test_truncate_then_rerun_equals_a_fresh_run(prims):
    fresh = np.concatenate([prims.forward(rows(0, 0, SEQ[:10])), prims.forward(rows(0, 10, SEQ[10:30]))])
    prims.release(0)
    # lane 1: a draft of 8 with 2 right and 6 wrong, rolled back to the 2, then the truth
    prims.forward(rows(1, 0, SEQ[:10]))
    draft = np.concatenate([SEQ[10:12], (SEQ[12:18] + 1) % 256])
    prims.forward(rows(1, 10, draft))
    prims.truncate(1, 12)
    again = prims.forward(rows(1, 12, SEQ[12:30]))
    assert np.array_equal(bits(again), bits(fresh[12:30]))
    # all the way back to empty
    prims.truncate(1, 0)
    assert np.array_equal(bits(prims.forward(rows(1, 0, SEQ[:10]))), bits(fresh[:10]))


def test_lanes_sharing_a_pass_equal_each_lane_alone(tiny, prims):
    cfg, weights = tiny
    seqs = {0: SEQ[:7], 1: SEQ[5:8], 2: SEQ[20:32]}
    alone = {}
    for lane, s in seqs.items():
        alone[lane] = prims.forward(rows(lane, 0, s))
        prims.release(lane)
    together = prims.forward(concat(*(rows(lane, 0, s) for lane, s in seqs.items())))
    offset = 0
    for lane, s in seqs.items():
        assert np.array_equal(bits(together[offset:offset + len(s)]), bits(alone[lane]))
        close_to_reference(alone[lane], reference_forward(cfg, weights, s))
        offset += len(s)
    # and decoding on from there, lanes packed in another order, one row each
    step = prims.forward(concat(rows(2, 12, SEQ[32:33]), rows(0, 7, SEQ[7:8]), rows(1, 3, SEQ[8:9])))
    close_to_reference(step[0], reference_forward(cfg, weights, SEQ[20:33])[-1])
    close_to_reference(step[1], reference_forward(cfg, weights, SEQ[:8])[-1])


def test_logit_rows_come_back_in_the_order_asked(prims):
    full = prims.forward(rows(0, 0, SEQ[:12]))
    prims.release(0)
    wanted = np.array([11, 3, 3, 0, 7])
    part = prims.forward(rows(0, 0, SEQ[:12], logits=wanted))
    assert np.array_equal(bits(part), bits(full[wanted]))
    prims.release(0)
    assert prims.forward(rows(0, 0, SEQ[:12], logits=[])).shape == (0, 256)


def test_lanes_apart_are_moved_side_by_side_once_and_stay_exact(prims):
    a = prims.forward(rows(0, 0, SEQ[:9]))
    b = prims.forward(rows(2, 0, SEQ[9:14]))
    prims.release(0), prims.release(2)
    moves = prims.cache_moves
    both = prims.forward(concat(rows(2, 0, SEQ[9:14]), rows(0, 0, SEQ[:9])))
    assert prims.cache_moves == moves + 1  # one lane swapped next to the other
    assert np.array_equal(bits(both[:5]), bits(b)) and np.array_equal(bits(both[5:]), bits(a))
    # the next passes of the same lanes read their caches where they now are: no more moves, and
    # each lane's cache (moved or not) holds what that lane wrote
    a_next = prims.forward(rows(0, 9, SEQ[9:11]))
    b_next = prims.forward(rows(2, 5, SEQ[14:15]))
    prims.truncate(0, 9), prims.truncate(2, 5)
    together = prims.forward(concat(rows(0, 9, SEQ[9:11]), rows(2, 5, SEQ[14:15])))
    assert prims.cache_moves == moves + 1
    assert np.array_equal(bits(together[:2]), bits(a_next)) and np.array_equal(bits(together[2:]), bits(b_next))
    keys, _ = prims.cache_rows(2)
    assert keys.shape[2] == 6  # lane 2's own 6 positions, wherever its row is


def test_a_long_lane_and_a_short_one_run_apart_without_padding(prims):
    long_alone = prims.forward(rows(0, 0, SEQ[:40]))
    prims.release(0)
    short_alone = prims.forward(rows(1, 0, SEQ[:1]))
    prims.release(1)
    runs = prims.runs
    both = prims.forward(concat(rows(0, 0, SEQ[:40]), rows(1, 0, SEQ[:1])))
    assert prims.runs == runs + 2  # 40 rows of padding cost more than a second run
    assert np.array_equal(bits(both[:40]), bits(long_alone)) and np.array_equal(bits(both[40:]), bits(short_alone))


def test_verify_sample_draws_the_argmax_under_greedy(prims):
    logits = prims.forward(rows(0, 0, SEQ[:5]))
    k = logits.shape[0]
    sample = SampleRows(
        mode=np.zeros(k, np.int64), temperature=np.ones(k, np.float32), top_p=np.ones(k, np.float32),
        top_k=np.zeros(k, np.int64), rng_counter_base=np.zeros(k, np.int64), position=np.arange(k, dtype=np.int64),
        draft=np.argmax(logits, axis=1).astype(np.int64),
    )
    tokens, match = prims.verify_sample(logits, sample)
    assert np.array_equal(tokens, np.argmax(logits, axis=1)) and match.all()


def test_capabilities(tiny, prims):
    cfg, _ = tiny
    caps = prims.capabilities
    assert caps.verify_rows and caps.truncate_partial and caps.kernel_capabilities == 0
    assert (caps.vocab, caps.eos, caps.max_lanes, caps.max_context) == (cfg.vocab, cfg.eos, 3, 64)
    assert prims.config == cfg


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_context=4096), "max_context 4096 outside 2..512"),
        (dict(max_lanes=0), "max_lanes must be >= 1"),
        (dict(optimization="fast"), "optimization 'fast' unknown"),
    ],
)
def test_bad_constructor_arguments_are_refused(tiny_model_dir, kw, message):
    with pytest.raises(StatusError) as err:
        OrtDecoderPrimitives(tiny_model_dir, **{"max_context": 64, **kw})
    assert err.value.status == Status.BAD_ARGUMENT and message in str(err.value)


def test_a_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(StatusError, match=f"{tmp_path}: no config.json"):
        OrtDecoderPrimitives(tmp_path)


def test_closed_primitives_refuse_work(tiny_model_dir):
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=1, max_context=16)
    p.close()
    with pytest.raises(StatusError, match="used after close"):
        p.forward(rows(0, 0, SEQ[:2]))


def test_greedy_tokens_come_from_the_pass_and_equal_the_greedy_graphs(prims):
    """The pass form's ArgMax output is what the verify graph's greedy rows draw on the same
    logits: a greedy-only verify_sample returns it without a sampler run; a batch with a Gumbel
    row runs the sampler, whose greedy rows agree."""
    from sf_trt.backends.ort_sampler import OrtVerifySampler

    logits = prims.forward(concat(rows(0, 0, SEQ[:7]), rows(2, 0, SEQ[7:12], logits=[4])))
    assert logits.greedy is not None and logits.greedy.shape == (8,)
    k = logits.shape[0]
    draft = np.where(np.arange(k) % 2 == 0, logits.greedy, -1)
    greedy_rows = SampleRows(np.zeros(k, np.int64), np.ones(k, np.float32), np.ones(k, np.float32), np.zeros(k, np.int64),
                             np.zeros(k, np.int64), np.arange(k, dtype=np.int64) + 1, draft)
    sampler = OrtVerifySampler(prims.capabilities.vocab)
    want_tokens, want_match = sampler.run(np.asarray(logits), greedy_rows)
    runs_before = prims._sampler
    prims._sampler = None  # a sampler run would fail: the greedy path must not need one
    try:
        tokens, match = prims.verify_sample(logits, greedy_rows)
    finally:
        prims._sampler = runs_before
    assert np.array_equal(tokens, want_tokens) and np.array_equal(match, want_match)
    assert np.array_equal(tokens, np.asarray(logits).argmax(axis=1))
    mixed = SampleRows(**{**greedy_rows.__dict__, "mode": np.array([1] + [0] * (k - 1), np.int64)})
    got, _ = prims.verify_sample(logits, mixed)
    assert np.array_equal(got[1:], want_tokens[1:])


def test_intra_op_threads_sleep_by_default_and_spinning_changes_no_bits(tiny_model_dir):
    """onnxruntime's intra-op threads sleep between ops unless ``spinning=True``; the rows come
    out with the same bits either way (2 threads, so there is a pool to spin or not)."""
    got = {}
    for spinning in (False, True):
        with OrtDecoderPrimitives(tiny_model_dir, max_lanes=2, max_context=64, threads=2, spinning=spinning) as p:
            options = p._session.get_session_options()
            assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
            got[spinning] = p.forward(concat(rows(0, 0, SEQ[:9]), rows(1, 0, SEQ[9:14], logits=[4])))
    assert np.array_equal(bits(got[False]), bits(got[True]))


def _pages_of(arrays: list[np.ndarray]) -> dict[str, int]:
    """/proc/self/smaps' ``Rss`` and ``AnonHugePages`` (kB) summed over the mappings that hold
    the bytes of ``arrays`` (a madvise of part of a mapping splits it; the kernel merges
    neighbouring ones), each mapping once, and ``THPeligible`` (any)."""
    spans = [(a.__array_interface__["data"][0], a.__array_interface__["data"][0] + a.nbytes) for a in arrays]
    sums, inside = {"Rss": 0, "AnonHugePages": 0, "THPeligible": 0}, False
    with open("/proc/self/smaps", encoding="ascii") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = any(start < hi and lo < end for lo, hi in spans)
            elif inside and head[:-1] in sums:
                value = int(line.split()[1])
                sums[head[:-1]] = max(sums[head[:-1]], value) if head == "THPeligible:" else sums[head[:-1]] + value
    return sums


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_the_kv_cache_is_committed_only_where_positions_are_written(tiny_model_dir):
    """The cache is allocated in small pages, never transparent huge pages: with them a lane's
    first prefill zeroed its whole window (1-5 s at 8192 positions on the real model, issue 23)
    and the RSS grew by the window. The arrays grow to the positions the lanes need, in the same
    small pages: 64 lanes, one lane of 500 positions (the arrays grown to 512, 4 MiB per layer's
    K or V), one of 10: a few pages per (layer, lane, head) row written, not megabytes."""
    rng = np.random.default_rng(3)
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=64, max_context=512, threads=1) as p:
        p.forward(rows(0, 0, SEQ[:10]))
        p.forward(rows(1, 0, rng.integers(0, 256, 500)))
        assert p.cache_resizes == 2  # 64 positions, then 512
        caches = p._keys + p._values
        assert all(cache.nbytes >= 4 << 20 for cache in caches)
        pages = _pages_of(caches)
        assert pages == {"Rss": pages["Rss"], "AnonHugePages": 0, "THPeligible": 0}
        # kB: per layer's K or V 2 heads x (32 KiB of lane 1 + a page of lane 0), a page or two more
        assert pages["Rss"] <= 96 * len(caches)


# -- the host cache's extent: grown and shrunk as lanes need, never a bit of difference --------

LONG = np.random.default_rng(21).integers(0, 256, 300)


def _one_at_a_time(prims, lane: int, tokens: np.ndarray, start: int = 0) -> np.ndarray:
    return np.concatenate([prims.forward(rows(lane, start + i, tokens[i:i + 1])) for i in range(len(tokens))])


@pytest.fixture
def wide(tiny_model_dir):
    """3 lanes of 320 positions: room for extents of 64 to 320 (the whole window, 321)."""
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=320, threads=1)
    yield p
    p.close()


def test_the_cache_grows_and_shrinks_mid_conversation_and_rows_keep_their_bits(tiny_model_dir, wide):
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=320, threads=1) as fresh:
        alone = _one_at_a_time(fresh, 1, LONG[:90])
    # lane 1 decodes beside lane 0, which prefills 250 positions (the arrays grow to 256), then
    # finishes (they shrink back to what lane 1 needs), while lane 1 goes on
    got = [wide.forward(rows(1, 0, LONG[:30]))]
    assert wide._extent == 64
    wide.forward(rows(0, 0, LONG[50:300]))
    assert wide._extent == 256
    got.append(_one_at_a_time(wide, 1, LONG[30:60], start=30))  # runs of extent 64 (copies), then 128 (the arrays' whole)
    wide.release(0)
    got.append(_one_at_a_time(wide, 1, LONG[60:90], start=60))
    assert wide._extent == 128 and wide.cache_resizes == 4  # 64, 256, back to 64, then 128 past position 63
    assert np.array_equal(bits(np.concatenate(got)), bits(alone))


def test_a_lane_crossing_a_key_block_with_drafts_rolled_back_across_it(prims, tiny_model_dir):
    """Positions 58..66: a 9-row verify pass straddles 64 (the arrays grow to 128 mid-pass's
    positions), is rolled back to 62 (below the block), then decoded row by row past it."""
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=128, threads=1) as fresh:
        plain = _one_at_a_time(fresh, 0, LONG[:80])
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=128, threads=1) as p:
        head = p.forward(rows(0, 0, LONG[:58]))
        assert p._extent == 64
        draft = np.concatenate([LONG[58:62], (LONG[62:67] + 1) % 256])  # 4 right, 5 wrong
        verify = p.forward(rows(0, 58, draft))
        assert p._extent == 128
        p.truncate(0, 62)
        tail = _one_at_a_time(p, 0, LONG[62:80], start=62)
        assert p._extent == 128  # a rollback below the block does not shrink the arrays
    assert np.array_equal(bits(head), bits(plain[:58]))
    assert np.array_equal(bits(verify[:4]), bits(plain[58:62]))  # the 4 rows whose inputs were right
    assert np.array_equal(bits(tail), bits(plain[62:80]))


def test_prefix_blocks_saved_after_a_grow_load_into_a_fresh_cache_exactly(tiny_model_dir, wide):
    full = wide.forward(rows(0, 0, LONG[:150]))  # the arrays grow to 192
    assert wide._extent == 192
    pool = wide.open_block_pool(1 << 20, 64)
    blocks = [pool.take(), pool.take()]
    wide.save_block(0, 0, blocks[0])
    wide.save_block(0, 64, blocks[1])
    keys, values = wide.cache_rows(0)
    assert np.array_equal(np.concatenate([pool.arrays[0][b] for b in blocks], axis=2), keys[:, :, :128])
    assert np.array_equal(np.concatenate([pool.arrays[1][b] for b in blocks], axis=2), values[:, :, :128])
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=320, threads=1) as other:
        other.forward(rows(0, 0, LONG[200:210]))  # another lane first: the arrays hold 64
        theirs = other.open_block_pool(1 << 20, 64)
        taken = [theirs.take(), theirs.take()]
        for part, ours in zip(theirs.arrays, pool.arrays):
            part[taken] = ours[blocks]
        other.load_prefix(2, taken)  # grown to 128 to take them
        assert other._extent == 128
        rest = other.forward(rows(2, 128, LONG[128:150]))
        assert np.array_equal(bits(rest), bits(full[128:]))
        assert np.array_equal(other.cache_rows(2)[0], keys)
