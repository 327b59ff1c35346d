"""The `Primitives` protocol: the few operations the Executor runs on a backend.

A backend (the onnxruntime fake, the onnxruntime decoder, TensorRT) implements
``_forward_impl``, ``_verify_sample_impl``, ``_truncate_impl`` and
``_release_impl``; :class:`PrimitivesBase` checks every call's shapes, dtypes and
ranges once, at this seam, so no two backends can disagree about what counts as
bad input. A refused call raises :class:`~sf_trt.abi.StatusError` and changes
nothing.

State model (the same on every backend). Each lane *slot* ``0 <= s < max_lanes``
holds the model state of positions ``0 .. state_len(s) - 1`` (the fake: token
history; a decoder: its KV cache). A forward pass writes the state of the rows it
is given and must start each lane exactly at ``state_len``; rolling back is
``truncate(s, length)``: the length moves back and rows past it are dead, to be
overwritten by the next pass (gpt-fast's cursor, not a copy).

Prefix state (optional, ``Capabilities.state_bytes_per_token > 0``): the backend
allocates a :class:`~sf_trt.block_pool.BlockPool` once (``open_block_pool``, sized to
the prefix cache's budget); ``save_block`` copies a block of a slot's positions into
a taken slot of the pool, and ``load_prefix`` writes pool blocks into an empty slot
as its first positions; the executor's prefix cache (:mod:`sf_trt.prefix_cache`)
decides which pool slots hold what, across requests.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Optional

import numpy as np

from .abi import Sampling, Status, StatusError
from .block_pool import BlockPool

__all__ = ["Capabilities", "Rows", "LogitAdjust", "SampleRows", "SAMPLE_ROW_FIELDS", "RowFault", "PrimitivesBase"]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend can do; the Executor and strategy registration read it."""

    vocab: int
    eos: int
    """The model's end-of-sequence token."""
    max_lanes: int
    max_context: int
    """Positions a lane's state holds: a lane's prompt plus output is at most this long."""
    max_rows_per_pass: int
    verify_rows: bool
    """A pass returns a logit row at every position asked for, not only each lane's last."""
    truncate_partial: bool
    """State can be rolled back to any prefix, not only emptied."""
    kernel_capabilities: int = 0
    """Bitmask of optional kernel capabilities on offer (0: none)."""
    top_k_limit: int = 1024
    """The largest ``top_k`` the verify-and-sample graph supports."""
    logprobs: bool = False
    """The backend reports each drawn token's logprob and the most likely alternatives
    (:meth:`PrimitivesBase.logprobs`); lanes may ask for logprobs only then."""
    state_bytes_per_token: int = 0
    """Bytes of state one position holds in a block pool (``open_block_pool``, ``save_block``,
    ``load_prefix``); 0: the backend cannot save and load state, so it has no prefix cache."""


def _int_rows(name: str, value: Any, op: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise StatusError(
            Status.BAD_ARGUMENT, f"{op}: {name} must be a 1-D integer array (got dtype {arr.dtype}, shape {arr.shape})"
        )
    return arr.astype(np.int64, copy=False)


@dataclasses.dataclass(frozen=True)
class Rows:
    """The packed rows of one forward pass, lanes in any order.

    Shapes: ``slots``, ``positions``, ``tokens``: ``[R]`` int64 (the lane's state slot
    in ``0..max_lanes-1``, absolute position, token id); ``logit_rows``: ``[K]`` int64
    indices into the R rows whose logits the pass returns, in that order. A lane's rows
    are consecutive positions starting at its slot's ``state_len``, in ascending order.
    """

    slots: np.ndarray
    positions: np.ndarray
    tokens: np.ndarray
    logit_rows: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.slots.shape[0])


@dataclasses.dataclass(frozen=True)
class LogitAdjust:
    """The entries of some logits rows to adjust before drawing from them: penalties,
    logit bias and ``min_tokens`` (:mod:`sf_trt.graphs.adjust` has the formula).

    ``rows`` int64 ``[A]``: which of the ``K`` logit rows (distinct, ascending); ``ids``
    int64 ``[A, E]``: each entry's token; ``bias``, ``scale``, ``frequency``,
    ``presence`` float32 ``[A, E]``: the graph's inputs of those names. Every entry
    not holding an adjustment is ``(0, 1, 0, 0)``, which leaves its logit as it is.
    """

    rows: np.ndarray
    ids: np.ndarray
    bias: np.ndarray
    scale: np.ndarray
    frequency: np.ndarray
    presence: np.ndarray
    allowed: Optional[np.ndarray] = None

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    def values(self) -> tuple[np.ndarray, ...]:
        """``(bias, scale, frequency, presence)``: the graph's float inputs, in its order."""
        return self.bias, self.scale, self.frequency, self.presence


@dataclasses.dataclass(frozen=True)
class SampleRows:
    """Per-logit-row sampling inputs to verify-and-sample, each ``[K]``.

    ``mode``: :class:`~sf_trt.abi.Sampling` value; ``temperature``/``top_p``
    float32; ``top_k`` int64 (0: off); ``rng_counter_base``: the lane's
    (``Plan.admit``'s); ``position``: absolute position of the token being
    drawn; ``draft``: the draft token proposed at that position, or -1;
    ``min_p`` float32 in [0, 1] (None: 0 on every row, min-p off); ``adjust``:
    the rows' logit adjustments (None: none), applied before the draw.
    """

    mode: np.ndarray
    temperature: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    rng_counter_base: np.ndarray
    position: np.ndarray
    draft: np.ndarray
    min_p: Optional[np.ndarray] = None
    adjust: Optional[LogitAdjust] = None

    def __post_init__(self) -> None:
        if self.min_p is None:
            object.__setattr__(self, "min_p", np.zeros(np.shape(self.mode), np.float32))

    @property
    def num_rows(self) -> int:
        return int(self.mode.shape[0])

    @staticmethod
    def empty() -> "SampleRows":
        z = np.zeros(0, np.int64)
        f = np.zeros(0, np.float32)
        return SampleRows(z, f, f, z, z, z, z, f)


class RowFault(enum.IntEnum):
    """What :meth:`PrimitivesBase.verify_sample` returns instead of a token for a
    logits row it cannot sample from. Every code is negative, never a token id, and
    the row's ``match`` is False."""

    NAN = -1
    """The row holds a NaN."""
    POS_INF = -2
    """The row holds +inf."""
    NO_FINITE = -3
    """Every logit of the row is -inf."""
    OVERFLOW = -4
    """Under ``GPU_GUMBEL``: the row's largest logit divided by its temperature overflows float32."""

    def describe(self) -> str:
        return {
            RowFault.NAN: "hold NaN",
            RowFault.POS_INF: "hold +inf",
            RowFault.NO_FINITE: "are all -inf",
            RowFault.OVERFLOW: "overflow float32 once divided by the temperature",
        }[self]


SAMPLE_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(SampleRows) if f.name != "adjust")
"""The per-row ``[K]`` arrays of :class:`SampleRows` (``adjust`` is a record of its own)."""
_MODE_MIN, _MODE_MAX = min(Sampling), max(Sampling)


class PrimitivesBase:
    """Validates every call once, then runs the backend's ``*_impl``.

    Subclasses set ``self.capabilities`` and implement the four ``_*_impl``
    methods; they keep ``self._state_len`` (int64 ``[max_lanes]``) in step via
    this class, which updates it after a successful forward or truncate.
    """

    capabilities: Capabilities

    def __init__(self, capabilities: Capabilities) -> None:
        self.capabilities = capabilities
        self._state_len = np.zeros(capabilities.max_lanes, np.int64)
        self.block_pool: Optional[BlockPool] = None
        """Where prefix blocks live (:meth:`open_block_pool`); None until opened."""

    # -- the protocol -------------------------------------------------------

    def forward(self, rows: Rows) -> Any:
        """Run one pass over ``rows``; return logits ``[K, vocab]`` float32 for
        ``rows.logit_rows`` (a backend array: numpy on the CPU, device memory
        on TensorRT; hand it to :meth:`verify_sample` or read it with
        :meth:`logits_host`)."""
        lanes, positions, tokens, logit_rows = self._check_rows(rows)
        out = self._forward_impl(Rows(lanes, positions, tokens, logit_rows))
        if lanes.size:
            np.maximum.at(self._state_len, lanes, positions + 1)
        return out

    def verify_sample(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        """Draw one token per logit row and compare it with that row's draft.

        Returns ``(tokens [K] int64, match [K] bool)``, ``match[i]`` being
        ``tokens[i] == sample.draft[i]``. The token drawn depends only on the
        row's logits and its sampling inputs, never on the other rows. A row
        whose logits cannot be sampled from (NaN, +inf, all -inf, or overflowing
        at its temperature) gets a :class:`RowFault` code instead of a token and
        ``match`` False; the other rows are drawn as usual.

        ``sample.adjust`` rows are adjusted first (:meth:`_adjust_impl`), and drawn, and
        checked for faults, from the adjusted logits; ``logits`` itself is left as it
        is (logprobs report the model's raw distribution).
        """
        self._check_sample(logits, sample)
        if sample.adjust is not None and sample.adjust.num_rows:
            logits = self._adjust_impl(logits, sample.adjust)
        tokens, match = self._verify_sample_impl(logits, sample)
        fault = self.row_faults(logits, sample)
        if fault.any():
            tokens = np.where(fault != 0, fault, tokens)
            match = match & (fault == 0)
        return tokens, match

    def truncate(self, lane: int, length: int) -> None:
        """Roll lane ``lane``'s state back to ``length`` positions."""
        self._check_lane("truncate", lane)
        current = int(self._state_len[lane])
        if not 0 <= length <= current:
            raise StatusError(
                Status.BAD_ARGUMENT, f"truncate(lane={lane}): length {length} outside 0..{current} (the state's length)"
            )
        if length not in (0, current) and not self.capabilities.truncate_partial:
            raise StatusError(
                Status.UNSUPPORTED, f"truncate(lane={lane}): this backend cannot roll back to a prefix ({length} of {current})"
            )
        self._truncate_impl(lane, length)
        self._state_len[lane] = length

    def release(self, lane: int) -> None:
        """Free slot ``lane``: its state is empty afterwards."""
        self._check_lane("release", lane)
        self._release_impl(lane)
        self._state_len[lane] = 0

    def open_block_pool(self, budget_bytes: int, block_tokens: int) -> BlockPool:
        """Allocate the pool prefix blocks live in, once: as many blocks of ``block_tokens``
        positions as ``budget_bytes`` holds (``state_bytes_per_token`` each position). It is
        ``self.block_pool`` afterwards; a later call replaces it (what the old one held is gone)."""
        op = f"open_block_pool(budget_bytes={budget_bytes}, block_tokens={block_tokens})"
        self._check_state_io(op)
        if not (int(budget_bytes) >= 0 and int(block_tokens) >= 1):
            raise StatusError(Status.BAD_ARGUMENT, f"{op}: need budget_bytes >= 0 and block_tokens >= 1")
        self.block_pool = BlockPool.for_budget(int(budget_bytes), int(block_tokens), self._block_parts(int(block_tokens)))
        return self.block_pool

    def save_block(self, lane: int, start: int, index: int) -> None:
        """Copy positions ``[start, start + block_tokens)`` of slot ``lane``'s state (within its
        ``state_len``) into block ``index`` of the pool, a slot the caller took from it."""
        op = f"save_block(lane={lane}, start={start}, index={index})"
        self._check_lane("save_block", lane)
        pool = self._check_pool(op, [index])
        current = int(self._state_len[lane])
        if not (0 <= start and start + pool.block_tokens <= current):
            raise StatusError(Status.BAD_ARGUMENT, f"{op}: a block of {pool.block_tokens} positions from {start} is outside the state's {current} positions")
        self._save_block_impl(lane, int(start), int(index))

    def load_prefix(self, lane: int, indices: list[int]) -> None:
        """Make pool blocks ``indices``, in order, the first positions of empty slot ``lane``'s
        state; its ``state_len`` is then ``len(indices) * block_tokens``."""
        self._check_lane("load_prefix", lane)
        op = f"load_prefix(lane={lane}, {len(indices)} blocks)"
        pool = self._check_pool(op, indices)
        total = len(indices) * pool.block_tokens
        if self._state_len[lane]:
            raise StatusError(Status.BAD_ARGUMENT, f"{op}: the slot holds {int(self._state_len[lane])} positions (it must be empty)")
        if total > self.capabilities.max_context - 1:
            raise StatusError(Status.CAPACITY_EXHAUSTED, f"{op}: {total} positions, more than the context's {self.capabilities.max_context} leave room for")
        self._load_prefix_impl(lane, [int(i) for i in indices])
        self._state_len[lane] = total

    def state_len(self, lane: int) -> int:
        """Positions of state lane ``lane`` holds."""
        self._check_lane("state_len", lane)
        return int(self._state_len[lane])

    def logprobs(self, logits: Any, rows: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For logit rows ``rows`` ``[n]`` of ``logits`` (a :meth:`forward` result) and the tokens
        drawn from them ``[n]``: ``(logprob [n] float32, top_ids [n, N] int64, top_logprobs
        [n, N] float32)``, ``N = min(vocab, TOP_LOGPROBS_MAX)`` alternatives in descending
        order. Only when ``capabilities.logprobs``."""
        if not self.capabilities.logprobs:
            raise StatusError(Status.UNSUPPORTED, "logprobs: this backend does not report logprobs")
        rows, tokens = _int_rows("rows", rows, "logprobs"), _int_rows("tokens", tokens, "logprobs")
        if rows.shape != tokens.shape:
            raise StatusError(Status.BAD_ARGUMENT, f"logprobs: {rows.size} rows and {tokens.size} tokens (expected one token per row)")
        return self._logprobs_impl(logits, rows, tokens)

    def logits_host(self, logits: Any) -> np.ndarray:
        """Logits as a host numpy array ``[K, vocab]`` float32."""
        return np.asarray(logits)

    def close(self) -> None:
        """Release the backend's sessions and buffers; the object is unusable after."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what backends implement ---------------------------------------------

    def _logit_row_max(self, logits: Any) -> np.ndarray:
        """Each logits row's largest value, float32 ``[K]`` on the host (NaN where the
        row holds a NaN). A backend whose logits live on a device may override this
        with a reduction there, to copy ``K`` floats instead of ``K * vocab``."""
        return self.logits_host(logits).max(axis=1)

    def _adjust_impl(self, logits: Any, adjust: LogitAdjust) -> Any:
        """The logits with ``adjust``'s rows adjusted, as a new array (``logits`` unchanged).
        The backends mix in :class:`~sf_trt.backends.ort_adjust.HostLogitAdjust` (the adjust
        graph on the host); a backend without it refuses adjusted rows."""
        raise StatusError(Status.UNSUPPORTED, "verify_sample: this backend cannot adjust logits (penalties, logit_bias, min_tokens)")

    def _forward_impl(self, rows: Rows) -> Any:
        raise NotImplementedError

    def _verify_sample_impl(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _truncate_impl(self, lane: int, length: int) -> None:
        raise NotImplementedError

    def _release_impl(self, lane: int) -> None:
        self._truncate_impl(lane, 0)

    def _block_parts(self, block_tokens: int) -> list[tuple[tuple[int, ...], Any]]:
        """The ``(shape, dtype)`` of each array a block of ``block_tokens`` positions holds
        (:class:`~sf_trt.block_pool.BlockPool`'s ``parts``)."""
        raise NotImplementedError

    def _save_block_impl(self, lane: int, start: int, index: int) -> None:
        raise NotImplementedError

    def _load_prefix_impl(self, lane: int, indices: list[int]) -> None:
        raise NotImplementedError

    def _logprobs_impl(self, logits: Any, rows: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    # -- checks ----------------------------------------------------------------

    def _check_lane(self, op: str, lane: int) -> None:
        if not 0 <= int(lane) < self.capabilities.max_lanes:
            raise StatusError(
                Status.BAD_ARGUMENT, f"{op}(lane={lane}): slot outside 0..{self.capabilities.max_lanes - 1}"
            )

    def _check_state_io(self, op: str) -> None:
        if self.capabilities.state_bytes_per_token <= 0:
            raise StatusError(Status.UNSUPPORTED, f"{op}: {type(self).__name__} cannot save or load state (no prefix cache)")

    def _check_pool(self, op: str, indices: list[int]) -> BlockPool:
        """The pool, open, with every one of ``indices`` a taken slot of it."""
        self._check_state_io(op)
        pool = self.block_pool
        if pool is None:
            raise StatusError(Status.BAD_ARGUMENT, f"{op}: no block pool (open_block_pool first)")
        for index in indices:
            if not (isinstance(index, (int, np.integer)) and pool.is_taken(index)):
                raise StatusError(
                    Status.BAD_ARGUMENT, f"{op}: block {index!r} is not a taken slot of the pool ({pool.used} of {pool.capacity} taken)"
                )
        return pool

    def _check_rows(self, rows: Rows) -> tuple[np.ndarray, ...]:
        caps = self.capabilities
        lanes = _int_rows("slots", rows.slots, "forward")
        positions = _int_rows("positions", rows.positions, "forward")
        tokens = _int_rows("tokens", rows.tokens, "forward")
        logit_rows = _int_rows("logit_rows", rows.logit_rows, "forward")
        n = lanes.shape[0]

        def bad(status: Status, what: str) -> StatusError:
            return StatusError(status, f"forward: {what}")

        if positions.shape[0] != n or tokens.shape[0] != n:
            raise bad(Status.BAD_ARGUMENT, f"slots, positions, tokens differ in length ({n}, {positions.shape[0]}, {tokens.shape[0]})")
        if n > caps.max_rows_per_pass:
            raise bad(Status.CAPACITY_EXHAUSTED, f"{n} rows exceed max_rows_per_pass {caps.max_rows_per_pass}")
        if n and (lanes.min() < 0 or lanes.max() >= caps.max_lanes):
            raise bad(Status.BAD_ARGUMENT, f"lane slot outside 0..{caps.max_lanes - 1} (got {lanes.min()}..{lanes.max()})")
        if n and (tokens.min() < 0 or tokens.max() >= caps.vocab):
            raise bad(Status.TOKEN_OUT_OF_VOCAB, f"token outside 0..{caps.vocab - 1} (got {tokens.min()}..{tokens.max()})")
        if n and (positions.min() < 0 or positions.max() >= caps.max_context):
            raise bad(Status.CAPACITY_EXHAUSTED, f"position outside 0..{caps.max_context - 1} (got {positions.min()}..{positions.max()})")
        if logit_rows.size and (logit_rows.min() < 0 or logit_rows.max() >= n):
            raise bad(Status.BAD_ARGUMENT, f"logit_rows outside 0..{n - 1}")
        # Each lane's rows: ascending, consecutive, starting at its state length.
        expected = self._state_len.copy()
        for lane, pos in zip(lanes.tolist(), positions.tolist()):
            if pos != expected[lane]:
                raise bad(
                    Status.BAD_ARGUMENT,
                    f"lane {lane} row at position {pos}, expected {int(expected[lane])} (rows of a lane are consecutive from its state length)",
                )
            expected[lane] = pos + 1
        if not caps.verify_rows and logit_rows.size:
            wanted = lanes[logit_rows]
            if np.unique(wanted).size != wanted.size or np.any(positions[logit_rows] != expected[wanted] - 1):
                raise bad(Status.UNSUPPORTED, "this backend returns logits only at each lane's last row (verify_rows=False)")
        return lanes, positions, tokens, logit_rows

    def row_faults(self, logits: Any, sample: SampleRows) -> np.ndarray:
        """int64 ``[K]``: each row's :class:`RowFault` code, 0 where the row is usable."""
        fault = np.zeros(sample.num_rows, np.int64)
        if not sample.num_rows:
            return fault
        row_max = np.asarray(self._logit_row_max(logits), np.float32)  # NaN, +inf, -inf tell the faults apart
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scaled = row_max / np.asarray(sample.temperature, np.float32)
        gumbel = np.asarray(sample.mode) == int(Sampling.GPU_GUMBEL)
        fault[gumbel & np.isfinite(row_max) & ~np.isfinite(scaled)] = RowFault.OVERFLOW
        fault[row_max == -np.inf] = RowFault.NO_FINITE
        fault[row_max == np.inf] = RowFault.POS_INF
        fault[np.isnan(row_max)] = RowFault.NAN
        return fault

    def _check_sample(self, logits: Any, sample: SampleRows) -> None:
        k = sample.num_rows
        shape = tuple(getattr(logits, "shape", ()))
        if shape != (k, self.capabilities.vocab):
            raise StatusError(Status.BAD_ARGUMENT, f"verify_sample: logits shape {shape}, expected ({k}, {self.capabilities.vocab})")
        for name in SAMPLE_ROW_FIELDS:
            arr = getattr(sample, name)
            if arr.shape != (k,):
                raise StatusError(Status.BAD_ARGUMENT, f"verify_sample: {name} shape {arr.shape}, expected ({k},)")
        if k and (sample.rng_counter_base.min() < 0 or sample.position.min() < 0 or sample.position.max() >= 2**31):
            raise StatusError(Status.BAD_ARGUMENT, "verify_sample: rng_counter_base must be >= 0 and position in 0..2**31-1 (the hash's domain)")
        if k and (sample.mode.min() < _MODE_MIN or sample.mode.max() > _MODE_MAX):
            raise StatusError(Status.BAD_SAMPLING_MODE, f"verify_sample: unknown sampling mode in {sorted(set(sample.mode.tolist()))}")
        if k and not (np.all(sample.min_p >= 0) and np.all(sample.min_p <= 1)):  # NaN fails both
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"verify_sample: min_p must be in [0, 1] (got {sorted(set(np.asarray(sample.min_p).tolist()))[:4]})")
        if sample.adjust is not None:
            self._check_adjust(sample.adjust, k)

    def _check_adjust(self, adjust: LogitAdjust, k: int) -> None:
        def bad(status: Status, what: str) -> StatusError:
            return StatusError(status, f"verify_sample: adjust {what}")

        rows = _int_rows("rows", adjust.rows, "verify_sample: adjust")
        a = rows.shape[0]
        if a and (rows.min() < 0 or rows.max() >= k or np.any(np.diff(rows) <= 0)):
            raise bad(Status.BAD_ARGUMENT, f"rows must be distinct and ascending in 0..{k - 1} (got {rows.tolist()[:8]})")
        shape = np.shape(adjust.ids)
        if len(shape) != 2 or shape[0] != a or np.asarray(adjust.ids).dtype.kind not in "iu":
            raise bad(Status.BAD_ARGUMENT, f"ids must be an integer array [{a}, E] (got dtype {np.asarray(adjust.ids).dtype}, shape {shape})")
        for name, value in zip(("bias", "scale", "frequency", "presence"), adjust.values()):
            if np.shape(value) != shape:
                raise bad(Status.BAD_ARGUMENT, f"{name} shape {np.shape(value)}, expected {shape}")
        if adjust.allowed is not None and (np.shape(adjust.allowed) != (a, self.capabilities.vocab) or np.asarray(adjust.allowed).dtype != bool):
            raise bad(Status.BAD_ARGUMENT, f"allowed must be a bool array [{a}, {self.capabilities.vocab}] (got dtype {np.asarray(adjust.allowed).dtype}, shape {np.shape(adjust.allowed)})")
        if a and shape[1] and (adjust.ids.min() < 0 or adjust.ids.max() >= self.capabilities.vocab):
            raise bad(Status.TOKEN_OUT_OF_VOCAB, f"ids outside 0..{self.capabilities.vocab - 1}")
        with np.errstate(invalid="ignore"):
            if not (np.all(adjust.scale > 0) and np.all(np.isfinite(adjust.scale)) and np.all(np.isfinite(adjust.frequency))
                    and np.all(np.isfinite(adjust.presence)) and np.all(adjust.bias < np.inf)):  # NaN fails each
                raise bad(Status.BAD_SAMPLING_PARAMS, "values: need scale > 0 and finite, frequency and presence finite, bias < +inf, no NaN")
