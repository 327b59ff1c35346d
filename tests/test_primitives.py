"""The Primitives seam (sf_trt.primitives): every call checked once, whatever the backend."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

from sf_trt.abi import Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.primitives import SAMPLE_ROW_FIELDS, RowFault, Rows, SampleRows

CFG = FakeConfig(vocab=64, eos=63, copy_model=True, verify_rows=True, max_lanes=3, max_context=32, top_k_limit=16)


def rows(lanes, positions, tokens, logit_rows=()):
    a = lambda v: np.asarray(v, np.int64)  # noqa: E731
    return Rows(a(lanes), a(positions), a(tokens), a(logit_rows))


SAMPLE_FIELDS = list(SAMPLE_ROW_FIELDS)


def sample_rows(**one_row) -> SampleRows:
    """One row of sampling inputs: greedy, no draft, fields overridden by ``one_row``."""
    row = {**dict(mode=0, temperature=1.0, top_p=1.0, top_k=0, rng_counter_base=0, position=1, draft=-1), **one_row}
    return SampleRows(**{k: np.asarray([v], np.float32 if k in ("temperature", "top_p") else np.int64) for k, v in row.items()})


SEAM = {
    "forward row not at the state length": (lambda f: f.forward(rows([0], [1], [5])), Status.BAD_ARGUMENT, "expected 0"),
    "forward token past the vocabulary": (lambda f: f.forward(rows([0], [0], [64])), Status.TOKEN_OUT_OF_VOCAB, "outside 0..63"),
    "forward slot past max_lanes": (lambda f: f.forward(rows([5], [0], [1])), Status.BAD_ARGUMENT, "slot outside"),
    "forward position past the context": (lambda f: f.forward(rows([0], [32], [1])), Status.CAPACITY_EXHAUSTED, "position outside"),
    "forward arrays of different lengths": (lambda f: f.forward(rows([0, 0], [0, 1], [1])), Status.BAD_ARGUMENT, "differ in length"),
    "forward logit row past the rows": (lambda f: f.forward(rows([0], [0], [1], [1])), Status.BAD_ARGUMENT, "logit_rows"),
    "forward float arrays": (
        lambda f: f.forward(Rows(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(0))), Status.BAD_ARGUMENT, "integer",
    ),
    "truncate past the state": (lambda f: f.truncate(0, 3), Status.BAD_ARGUMENT, "outside 0..0"),
    "verify_sample rng key negative": (
        lambda f: f.verify_sample(np.zeros((1, 64), np.float32), sample_rows(rng_counter_base=-1)), Status.BAD_ARGUMENT, "rng_counter_base",
    ),
    "verify_sample unknown mode": (
        lambda f: f.verify_sample(np.zeros((1, 64), np.float32), sample_rows(mode=7)), Status.BAD_SAMPLING_MODE, "unknown sampling mode",
    ),
    "verify_sample logits of the wrong shape": (
        lambda f: f.verify_sample(np.zeros((2, 64), np.float32), SampleRows.empty()), Status.BAD_ARGUMENT, "logits shape",
    ),
}


@pytest.mark.parametrize("case", list(SEAM))
def test_the_primitives_check_every_call_once(case):
    call, status, words = SEAM[case]
    f = FakePrimitives(CFG)
    with pytest.raises(StatusError) as err:
        call(f)
    assert err.value.status == status and words in str(err.value), str(err.value)
    assert all(f.state_len(s) == 0 for s in range(CFG.max_lanes)), "a refused call changes nothing"


def partial_rollback_refused() -> None:
    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    f.truncate(0, 1)


def test_a_backend_without_partial_rollback_refuses_one():
    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    with pytest.raises(StatusError) as err:
        f.truncate(0, 1)
    assert err.value.status == Status.UNSUPPORTED
    assert f.state_len(0) == 3
    f.truncate(0, 0)


def test_a_backend_without_verify_rows_gives_logits_only_at_each_lanes_last_row():
    f = FakePrimitives(dataclasses.replace(CFG, verify_rows=False))
    with pytest.raises(StatusError) as err:
        f.forward(rows([0, 0], [0, 1], [1, 2], [0, 1]))
    assert err.value.status == Status.UNSUPPORTED
    assert f.forward(rows([0, 0], [0, 1], [1, 2], [1])).shape == (1, 64)


@pytest.mark.parametrize(
    "value, fault",
    [(np.nan, RowFault.NAN), (np.inf, RowFault.POS_INF), (-np.inf, RowFault.NO_FINITE), (3e38, RowFault.OVERFLOW)],
)
def test_verify_sample_gives_a_row_fault_for_logits_it_cannot_sample_and_draws_the_other_rows(value, fault):
    f = FakePrimitives(CFG)
    logits = np.zeros((3, 64), np.float32)
    logits[:, 5] = 4.0
    logits[1, :] = value
    sample = SampleRows(*(np.concatenate([getattr(sample_rows(mode=1, temperature=0.5), name)] * 3) for name in SAMPLE_FIELDS))
    tokens, match = f.verify_sample(logits, sample)
    assert tokens[1] == fault and not match[1]
    assert tokens[0] == tokens[2] and 0 <= tokens[0] < 64


def loaded(n: int, block_tokens: int = 2) -> tuple[FakePrimitives, int]:
    """A fake whose slot 0 holds tokens ``0..n-1`` (forwarded), with a pool of 4 blocks of
    ``block_tokens`` positions; and one taken slot of the pool."""
    f = FakePrimitives(CFG)
    f.forward(Rows(np.zeros(n, np.int64), np.arange(n), np.arange(n), np.zeros(0, np.int64)))
    return f, f.open_block_pool(4 * block_tokens * 8, block_tokens).take()


def test_state_blocks_round_trip_through_the_pool():
    f, index = loaded(3)
    f.save_block(0, 1, index)
    assert f.block_pool.arrays[0][index].tolist() == [1, 2] and f.block_pool.block_bytes == 2 * f.capabilities.state_bytes_per_token
    f.load_prefix(1, [index, index])
    other = f.block_pool.take()
    f.save_block(1, 1, other)
    assert f.state_len(1) == 4 and f.block_pool.arrays[0][other].tolist() == [2, 1]


def rows_refused(case: str) -> None:
    SEAM[case][0](FakePrimitives(CFG))


REFUSALS = {
    **{case: functools.partial(rows_refused, case) for case in SEAM},
    "truncate to a prefix without partial rollback": partial_rollback_refused,
    "logits at every row without verify rows": lambda: FakePrimitives(dataclasses.replace(CFG, verify_rows=False)).forward(
        rows([0, 0], [0, 1], [1, 2], [0, 1])
    ),
    "save_block outside the state": lambda: (lambda f, i: f.save_block(0, 2, i))(*loaded(3)),
    "save_block without a pool": lambda: FakePrimitives(CFG).save_block(0, 0, 0),
    "a block not taken from the pool": lambda: (lambda f, i: f.load_prefix(1, [i + 1]))(*loaded(2)),
    "load_prefix into a slot in use": lambda: (lambda f, i: f.load_prefix(0, [i]))(*loaded(2)),
    "load_prefix past the context": lambda: (lambda f, i: f.load_prefix(1, [i]))(*loaded(2, block_tokens=CFG.max_context)),
}
"""Every refusal above as a call that raises it, by the name docs/errors.md gives it."""
