"""The model engines behind the Primitives protocol: the copy model or a decoder.

Each adapter owns the model's state buffers on the device and turns the
protocol's flat :class:`~sf_trt.primitives.Rows` into the engine's inputs.
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


class CopyModel:
    """The fake's copy model: the state is each lane's tokens by position.

    Inputs ``history [max_lanes, max_context]`` (bound: the state) and the
    logit rows' ``lanes`` / ``positions`` ``[rows]``; output ``logits``.
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
        self.max_rows = min(b.shape[0] for b in self.row_inputs)
        self.logits_name = logits.name
        self.state = dev.zeros(state.shape, state.dtype)
        self.state_dtype = state.dtype
        runner.bind(COPY_STATE, self.state)

    def forward(self, rows: Rows, vocab: int) -> Any:
        dev = self.dev
        dev.put(
            self.state, (dev.to_device(rows.lanes), dev.to_device(rows.positions)),
            dev.to_device(rows.tokens.astype(numpy_dtype(self.state_dtype))),
        )
        k = int(rows.logit_rows.size)
        if k == 0:
            return dev.zeros((0, vocab), "float32")
        pick = rows.logit_rows
        feeds = {b.name: dev.to_device(getattr(rows, b.name)[pick].astype(numpy_dtype(b.dtype))) for b in self.row_inputs}
        return self.runner.run(feeds, capturable=k <= self.max_lanes)[self.logits_name]

    def close(self) -> None:
        self.state = None


class Decoder:
    """A Llama decoder (the model directory's ``decoder.onnx``): the state is each layer's KV cache.

    A pass packs its rows as ``[B lanes, T rows]`` (lanes in order of first
    appearance, short lanes padded with the trash position ``max_context``),
    asks for the logit rows by flat index ``b * T + t``, and gets this pass's
    K/V back as ``new_kv [layers, 2, B, T, kv_heads, head_dim]``; the real rows'
    K/V are then written into the caches at ``(lane, :, position, :)`` on the
    device. Rolled-back positions are masked by the graph (keys ``j <= p`` only)
    and overwritten by the next pass there.
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
        batch_max, rows_max, logit_max = plan["lane_ids"].shape[0], plan["input_ids"].shape[1], plan["logit_index"].shape[0]
        if batch_max < self.max_lanes:
            raise refuse(
                f"decoder engine {runner.name!r}: its profile takes {batch_max} lanes a pass, its cache holds "
                f"{self.max_lanes}; rebuild it with --max-lanes {self.max_lanes}"
            )
        self.max_rows = min(rows_max, logit_max)
        self.bufs = {}
        for pair in self.caches:
            for name in pair:
                b = plan[name]
                self.bufs[name] = dev.zeros(b.shape, b.dtype)
                runner.bind(name, self.bufs[name])
        self.dtypes = {name: numpy_dtype(plan[name].dtype) for name in DECODER_INPUTS}

    def forward(self, rows: Rows, vocab: int) -> Any:
        dev, n = self.dev, rows.num_rows
        if n == 0:
            return dev.zeros((0, vocab), "float32")
        # Pack: lane b of the pass in order of first appearance, row t within it.
        order, b_of = [], {}
        for lane in rows.lanes.tolist():
            if lane not in b_of:
                b_of[lane] = len(order)
                order.append(lane)
        b_idx = np.array([b_of[lane] for lane in rows.lanes.tolist()], np.int64)
        first = np.full(self.max_lanes, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, rows.lanes, rows.positions)
        t_idx = rows.positions - first[rows.lanes]  # a lane's rows are consecutive positions
        n_lanes, t_len = len(order), int(t_idx.max()) + 1
        input_ids = np.zeros((n_lanes, t_len), np.int64)
        positions = np.full((n_lanes, t_len), self.max_context, np.int64)  # padding: the trash slot
        input_ids[b_idx, t_idx] = rows.tokens
        positions[b_idx, t_idx] = rows.positions
        k = int(rows.logit_rows.size)
        # A pass with no logit rows still writes K/V: ask for row 0 and drop it.
        logit_index = (b_idx * t_len + t_idx)[rows.logit_rows] if k else np.zeros(1, np.int64)
        host = {"input_ids": input_ids, "positions": positions, "lane_ids": np.array(order, np.int64), "logit_index": logit_index}
        feeds = {name: dev.to_device(a.astype(self.dtypes[name])) for name, a in host.items()}
        out = self.runner.run(feeds, capturable=t_len == 1)
        new_kv = out["new_kv"]  # [layers, 2, B, T, kv_heads, head_dim]
        at = (dev.to_device(rows.lanes), slice(None), dev.to_device(rows.positions), slice(None))
        rows_bt = (dev.to_device(b_idx), dev.to_device(t_idx))
        for layer, (key_name, value_name) in enumerate(self.caches):
            dev.put(self.bufs[key_name], at, new_kv[layer, 0][rows_bt])
            dev.put(self.bufs[value_name], at, new_kv[layer, 1][rows_bt])
        return out["logits"] if k else dev.zeros((0, vocab), "float32")

    def close(self) -> None:
        self.bufs.clear()
