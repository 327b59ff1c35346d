"""Fakes that misbehave on purpose, for the scheduler, engine-loop and server tests."""

from __future__ import annotations

import time

import numpy as np

from sf_trt.fake import FakePrimitives

POISON = 250
"""A token (a byte, for the byte tokenizer) whose presence in a pass makes :class:`FaultyFake` raise."""


class SlowFake(FakePrimitives):
    """The fake with a pause in every forward pass, so requests overlap for long enough."""

    pause_s = 0.003

    def _forward_impl(self, rows):
        time.sleep(self.pause_s)
        return super()._forward_impl(rows)


class FaultyFake(FakePrimitives):
    """A forward pass holding :data:`POISON` raises (a backend fault); with ``broken``
    set, every forward and release does (a backend that cannot even free a lane)."""

    broken = False

    def _forward_impl(self, rows):
        if self.broken or (np.asarray(rows.tokens) == POISON).any():
            raise RuntimeError("injected fault: poisoned row")
        return super()._forward_impl(rows)

    def _release_impl(self, lane):
        if self.broken:
            raise RuntimeError("injected fault in release")
        super()._release_impl(lane)
