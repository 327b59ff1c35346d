"""Fault injection: any backend's primitives, failing on cue.

``FaultyPrimitives(inner, [Fault("decode", 3)])`` is ``inner`` (the fake, the
onnxruntime decoder, TensorRT: every call goes to the real backend) except that
its third decode forward raises :class:`InjectedFault`. It drives the tests of
the executor's fault contract (:mod:`sf_trt.executor`) at every primitive call
site, and the fault fuzz suite.

Each op is counted on its own, from 1:

==================  ==========================================================
op                  the calls counted
==================  ==========================================================
``prefill``         ``forward`` asking for no logits (the executor's prefill)
``decode``          ``forward`` asking for logits (the executor's decode steps)
``verify_sample``   ``verify_sample``
``truncate``        ``truncate``
``release``         ``release``
==================  ==========================================================

and a :class:`Fault`'s ``kind`` says what happens at its call:

* ``raise``: raise before the backend sees the call (nothing happened);
* ``raise_after``: the backend runs the call (its state changes), then raise;
* ``nan``, ``posinf``, ``neginf``, ``huge`` (``decode`` only): the call succeeds
  but the returned logits rows ``rows`` (all when None) are overwritten with NaN,
  +inf, -inf or 3e38. This needs logits in host memory (numpy): the fake and the
  onnxruntime decoder, not TensorRT's device buffers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional

import numpy as np

from .abi import Status, StatusError
from .primitives import PrimitivesBase, Rows, SampleRows

__all__ = ["Fault", "FaultyPrimitives", "InjectedFault", "OPS", "KINDS"]

OPS = ("prefill", "decode", "verify_sample", "truncate", "release")
KINDS = ("raise", "raise_after", "nan", "posinf", "neginf", "huge")
_POISON = {"nan": np.nan, "posinf": np.inf, "neginf": -np.inf, "huge": 3e38}


class InjectedFault(RuntimeError):
    """The exception a :class:`FaultyPrimitives` raises on cue."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """Fail the ``call``-th call (from 1) of ``op`` in the way ``kind`` says."""

    op: str
    call: int
    kind: str = "raise"
    rows: Optional[tuple[int, ...]] = None
    """For the logits kinds: which rows of the returned logits to overwrite, modulo
    their number (None: all)."""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise StatusError(Status.BAD_ARGUMENT, f"Fault: unknown op {self.op!r} (known: {', '.join(OPS)})")
        if self.kind not in KINDS:
            raise StatusError(Status.BAD_ARGUMENT, f"Fault: unknown kind {self.kind!r} (known: {', '.join(KINDS)})")
        if self.kind in _POISON and self.op != "decode":
            raise StatusError(Status.BAD_ARGUMENT, f"Fault: {self.kind!r} overwrites logits, which only 'decode' returns (got op {self.op!r})")
        if isinstance(self.call, bool) or not isinstance(self.call, int) or self.call < 1:
            raise StatusError(Status.BAD_ARGUMENT, f"Fault: call counts from 1 (got {self.call!r})")


class FaultyPrimitives:
    """``inner``'s primitives, failing as ``faults`` say; every other attribute is ``inner``'s.

    ``calls[op]`` counts the calls of each op so far; ``fired`` lists the faults
    that fired, in order, as ``"decode #3: raise"``.
    """

    def __init__(self, inner: PrimitivesBase, faults: Iterable[Fault] = ()) -> None:
        self.inner = inner
        self.faults = list(faults)
        self.calls = dict.fromkeys(OPS, 0)
        self.fired: list[str] = []

    @property
    def capabilities(self):
        return self.inner.capabilities

    def __getattr__(self, name: str) -> Any:  # state_len, logits_host, close, tokenizer, ...
        return getattr(self.inner, name)

    def _due(self, op: str) -> Optional[Fault]:
        self.calls[op] += 1
        for fault in self.faults:
            if fault.op == op and fault.call == self.calls[op]:
                self.fired.append(f"{op} #{fault.call}: {fault.kind}")
                return fault
        return None

    def _run(self, op: str, call, *args: Any) -> Any:
        fault = self._due(op)
        if fault is not None and fault.kind == "raise":
            raise InjectedFault(f"injected before {op} #{fault.call}")
        out = call(*args)
        if fault is not None and fault.kind == "raise_after":
            raise InjectedFault(f"injected after {op} #{fault.call}")
        if fault is not None:
            out = self._poison(out, fault)
        return out

    def _poison(self, logits: Any, fault: Fault) -> np.ndarray:
        if not isinstance(logits, np.ndarray):
            raise StatusError(
                Status.UNSUPPORTED, f"Fault {fault.kind!r}: the backend's logits are {type(logits).__name__}, not host numpy"
            )
        out = logits.copy()
        if len(out):
            out[[r % len(out) for r in fault.rows] if fault.rows is not None else slice(None)] = _POISON[fault.kind]
        return out

    # -- the protocol ---------------------------------------------------------

    def forward(self, rows: Rows) -> Any:
        op = "decode" if np.asarray(rows.logit_rows).size else "prefill"
        return self._run(op, self.inner.forward, rows)

    def verify_sample(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        return self._run("verify_sample", self.inner.verify_sample, logits, sample)

    def truncate(self, lane: int, length: int) -> None:
        self._run("truncate", self.inner.truncate, lane, length)

    def release(self, lane: int) -> None:
        self._run("release", self.inner.release, lane)

