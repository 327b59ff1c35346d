"""The model engines behind the Primitives protocol: the copy model or a decoder.

Each adapter owns the model's state buffers on the device and turns the
protocol's flat :class:`~sf_trt.primitives.Rows` into the engine's inputs. A
pass runs inside :meth:`~.device.Device.on_stream`: every device op of it (the
gathers of ``new_kv`` rows and logit rows included, not only the writes) is
ordered on the runtime's one stream with the engine's work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...formats.model_dir import INPUTS as DECODER_INPUTS
from ...formats.model_dir import cache_names
from ...graphs.copy_model import STATE as COPY_STATE
from ...primitives import Rows
from .buffers import numpy_dtype
from .device import Device
from .errors import refuse
from .runners import EngineRunner

__all__ = ["CopyModel", "Decoder", "COPY_STATE", "DECODER_INPUTS"]


def _padded(values: np.ndarray, size: int, fill: int, dtype) -> np.ndarray:
    """``values`` then ``fill`` up to ``size`` entries, as ``dtype``."""
    out = np.full(size, fill, dtype)
    out[: values.size] = values
    return out


class CopyModel:
    """The fake's copy model: the state is each lane's tokens by position.

    Inputs ``history [max_lanes, max_context]`` (bound: the state) and the
    logit rows' ``lanes`` / ``positions`` ``[rows]``; output ``logits``. Every
    run takes exactly ``rows`` rows (the engine's one shape): a pass's logit rows
    are padded (lane 0, position 0; their logits dropped) and split into runs of
    that many.
    """

    def __init__(self, runner: EngineRunner, dev: Device) -> None:
        plan = runner.plan
        state = plan[COPY_STATE]
        logits = plan.outputs()[0]
        if len(state.shape) != 2 or len(logits.shape) != 2:
            raise refuse(f"model engine {runner.name!r}: expected {COPY_STATE} [lanes, context] and logits [rows, vocab]")
        self.runner, self.dev = runner, dev
        self.max_lanes, self.max_context = state.shape
        self.vocab = logits.shape[1]
        self.row_inputs = [b for b in plan.inputs() if b.name != COPY_STATE]
        missing = [b.name for b in self.row_inputs if b.name not in ("lanes", "positions")]
        if missing:
            raise refuse(f"copy-model engine {runner.name!r} has inputs {missing}; expected only history, lanes, positions")
        sizes = {b.shape[0] for b in self.row_inputs} | {logits.shape[0]}
        if len(sizes) != 1:
            raise refuse(f"copy-model engine {runner.name!r}: lanes, positions and logits take {sorted(sizes)} rows; expected one size")
        self.max_rows = sizes.pop()
        self.logits_name = logits.name
        self.state = dev.zeros(state.shape, state.dtype)
        self.state_dtype = state.dtype
        runner.bind(COPY_STATE, self.state)

    def forward(self, rows: Rows, vocab: int) -> Any:
        with self.dev.on_stream():
            return self._forward(rows, vocab)

    def _forward(self, rows: Rows, vocab: int) -> Any:
        dev = self.dev
        dev.put(
            self.state, (dev.to_device(rows.slots), dev.to_device(rows.positions)),
            dev.to_device(rows.tokens.astype(numpy_dtype(self.state_dtype))),
        )
        k, size = int(rows.logit_rows.size), self.max_rows
        if k == 0:
            return dev.zeros((0, vocab), "float32")
        by_input = {"lanes": rows.slots, "positions": rows.positions}  # the copy graph's row inputs (graphs/copy_model.py)
        picked = {b.name: by_input[b.name][rows.logit_rows] for b in self.row_inputs}
        out = None
        for lo in range(0, k, size):
            m = min(size, k - lo)
            feeds = {b.name: dev.to_device(_padded(picked[b.name][lo : lo + m], size, 0, numpy_dtype(b.dtype))) for b in self.row_inputs}
            logits = self.runner.run(feeds)[self.logits_name]
            if k <= size:
                return logits[:k]
            if out is None:
                out = dev.zeros((k, vocab), "float32")
            dev.put(out, (slice(lo, lo + m),), logits[:m])
        return out

    def close(self) -> None:
        self.state = None


class Decoder:
    """A Llama decoder (the model directory's ``decoder.onnx``): the state is each layer's KV cache.

    Every run has the engine's one shape ``[L lanes, T rows per lane]`` (``L`` = the
    cache's lane slots): lane ``l`` of a pass always sits at batch index ``l``, and a
    lane's rows (consecutive positions from its first in the pass) fill its row at
    ``t = (position - first) mod T``, in run ``(position - first) div T``; everything
    else is padding at the trash position ``max_context``. Each run asks for its logit
    rows by flat index ``l * T + t`` (padded to ``L * T``) and returns this run's K/V as
    ``new_kv [layers, 2, L, T, kv_heads, head_dim]``; the real rows' K/V are written
    into the caches at ``(lane, :, position, :)`` on the device before the next run,
    which is how a lane split across runs sees its earlier rows. Rolled-back positions
    are masked by the graph (keys ``j <= p`` only) and overwritten by the next pass.
    """

    def __init__(self, runner: EngineRunner, dev: Device) -> None:
        plan = runner.plan
        self.runner, self.dev = runner, dev
        self.caches = []  # (key buffer name, value buffer name) per layer
        while all(name in plan for name in cache_names(len(self.caches))):
            self.caches.append(cache_names(len(self.caches)))
        if not self.caches:
            raise refuse(f"decoder engine {runner.name!r} has no past_key_0 / past_value_0 inputs")
        cache = plan["past_key_0"]
        if len(cache.shape) != 4:
            raise refuse(f"decoder engine {runner.name!r}: past_key_0 shape {cache.shape}, expected [lanes, kv_heads, context + 1, head_dim]")
        self.max_lanes, _, cache_len, _ = cache.shape
        self.max_context = cache_len - 1  # the last slot takes padding rows' K/V
        self.vocab = plan["logits"].shape[1]
        batch, self.rows_per_lane = plan["input_ids"].shape
        if batch != self.max_lanes or plan["lane_ids"].shape[0] != batch:
            raise refuse(
                f"decoder engine {runner.name!r}: its runs take {batch} lanes, its cache holds {self.max_lanes}; "
                f"rebuild it with `sf-trt build` (a run takes every lane slot)"
            )
        if plan["logit_index"].shape[0] != batch * self.rows_per_lane:
            raise refuse(
                f"decoder engine {runner.name!r}: {plan['logit_index'].shape[0]} logit rows a run, expected "
                f"{batch} lanes x {self.rows_per_lane} rows = {batch * self.rows_per_lane}"
            )
        self.max_rows = batch * self.rows_per_lane
        self.bufs = {}
        for pair in self.caches:
            for name in pair:
                b = plan[name]
                self.bufs[name] = dev.zeros(b.shape, b.dtype)
                runner.bind(name, self.bufs[name])
        self.dtypes = {name: numpy_dtype(plan[name].dtype) for name in DECODER_INPUTS}
        self.lane_ids = dev.to_device(np.arange(batch).astype(self.dtypes["lane_ids"]))  # lane l at index l, always

    def forward(self, rows: Rows, vocab: int) -> Any:
        with self.dev.on_stream():
            return self._forward(rows, vocab)

    def _forward(self, rows: Rows, vocab: int) -> Any:
        dev, n, k = self.dev, rows.num_rows, int(rows.logit_rows.size)
        if n == 0:
            return dev.zeros((0, vocab), "float32")
        L, T = self.max_lanes, self.rows_per_lane
        first = np.full(L, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, rows.slots, rows.positions)
        run_of, t = np.divmod(rows.positions - first[rows.slots], T)  # a lane's rows are consecutive positions
        flat = rows.slots * T + t  # each row's index among a run's L * T rows
        n_runs, out = int(run_of.max()) + 1, None
        for r in range(n_runs):
            here = np.flatnonzero(run_of == r)
            want = np.flatnonzero(run_of[rows.logit_rows] == r)  # the logit rows this run computes
            wanted_rows, pick = np.unique(rows.logit_rows[want], return_inverse=True)
            logits = self._run(rows, here, t[here], flat[wanted_rows])
            if n_runs == 1 and np.array_equal(pick, np.arange(k)):
                return logits[:k]  # the common case: one run, logit rows in order
            if k:
                out = dev.zeros((k, vocab), "float32") if out is None else out
                dev.put(out, (dev.to_device(want),), logits[dev.to_device(pick.astype(np.int64))])
        return out if k else dev.zeros((0, vocab), "float32")

    def _run(self, rows: Rows, here: np.ndarray, t: np.ndarray, logit_flat: np.ndarray) -> Any:
        """One run of the rows ``here`` (at row ``t`` of their lane); writes their K/V into the
        caches and returns the logits of the rows at ``logit_flat`` (first ``logit_flat.size`` rows)."""
        dev, L, T = self.dev, self.max_lanes, self.rows_per_lane
        lanes = rows.slots[here]
        input_ids = np.zeros((L, T), np.int64)
        positions = np.full((L, T), self.max_context, np.int64)  # padding: the trash slot
        input_ids[lanes, t] = rows.tokens[here]
        positions[lanes, t] = rows.positions[here]
        host = {"input_ids": input_ids, "positions": positions, "logit_index": _padded(logit_flat, L * T, 0, np.int64)}
        feeds = {name: dev.to_device(a.astype(self.dtypes[name])) for name, a in host.items()}
        feeds["lane_ids"] = self.lane_ids
        out = self.runner.run(feeds)
        new_kv = out["new_kv"]  # [layers, 2, L, T, kv_heads, head_dim]
        lanes_dev = dev.to_device(lanes)
        at = (lanes_dev, slice(None), dev.to_device(rows.positions[here]), slice(None))
        rows_lt = (lanes_dev, dev.to_device(t))
        for layer, (key_name, value_name) in enumerate(self.caches):
            dev.put(self.bufs[key_name], at, new_kv[layer, 0][rows_lt])
            dev.put(self.bufs[value_name], at, new_kv[layer, 1][rows_lt])
        return out["logits"]

    def close(self) -> None:
        self.bufs.clear()
