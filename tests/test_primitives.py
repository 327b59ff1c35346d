"""The Primitives seam (sf_trt.primitives): every call checked once, whatever the backend."""

from __future__ import annotations

import numpy as np
import pytest

from sf_trt.abi import Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.primitives import Rows

CFG = FakeConfig(vocab=64, eos=63, copy_model=True, verify_rows=True, max_lanes=3, max_context=32, top_k_limit=16)


def rows(lanes, positions, tokens, logit_rows=()):
    a = lambda v: np.asarray(v, np.int64)  # noqa: E731
    return Rows(a(lanes), a(positions), a(tokens), a(logit_rows))


@pytest.mark.parametrize(
    "call, status, words",
    [
        (lambda f: f.forward(rows([0], [1], [5])), Status.BAD_ARGUMENT, "expected 0"),
        (lambda f: f.forward(rows([0], [0], [64])), Status.TOKEN_OUT_OF_VOCAB, "outside 0..63"),
        (lambda f: f.forward(rows([5], [0], [1])), Status.BAD_ARGUMENT, "slot outside"),
        (lambda f: f.forward(rows([0], [32], [1])), Status.CAPACITY_EXHAUSTED, "position outside"),
        (lambda f: f.forward(rows([0, 0], [0, 1], [1])), Status.BAD_ARGUMENT, "differ in length"),
        (lambda f: f.forward(rows([0], [0], [1], [1])), Status.BAD_ARGUMENT, "logit_rows"),
        (lambda f: f.forward(Rows(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(0))), Status.BAD_ARGUMENT, "integer"),
        (lambda f: f.truncate(0, 3), Status.BAD_ARGUMENT, "outside 0..0"),
    ],
)
def test_the_primitives_check_every_call_once(call, status, words):
    f = FakePrimitives(CFG)
    with pytest.raises(StatusError) as err:
        call(f)
    assert err.value.status == status and words in str(err.value), str(err.value)
    assert all(f.state_len(s) == 0 for s in range(CFG.max_lanes)), "a refused call changes nothing"


def test_a_backend_without_partial_rollback_refuses_one():
    import dataclasses

    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    with pytest.raises(StatusError) as err:
        f.truncate(0, 1)
    assert err.value.status == Status.UNSUPPORTED
    assert f.state_len(0) == 3
    f.truncate(0, 0)


def test_a_backend_without_verify_rows_gives_logits_only_at_each_lanes_last_row():
    import dataclasses

    f = FakePrimitives(dataclasses.replace(CFG, verify_rows=False))
    with pytest.raises(StatusError) as err:
        f.forward(rows([0, 0], [0, 1], [1, 2], [0, 1]))
    assert err.value.status == Status.UNSUPPORTED
    assert f.forward(rows([0, 0], [0, 1], [1, 2], [1])).shape == (1, 64)
