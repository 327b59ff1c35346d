"""The value ranges a graph states for its integer inputs and its symbolic dims.

A graph the runtime runs (the verify graph, the copy model, the decoder) records,
in its ``metadata_props`` under :data:`RANGES_KEY`, the closed range of every
integer input it relies on and of every symbolic dim it computes with, as JSON::

    {"inputs": {"noise_add": [0, 4095], ...}, "dims": {"batch": [1, 65536], ...}}

They are preconditions: whoever feeds the graph keeps its inputs inside them (the
runtime's checks at the seam, or values built to fit, like the verify graph's noise
keys). ``sf_trt.export.int_bounds`` reads them to prove that every integer value the
graph computes stays where every backend computes it exactly (export/OPS.md,
"Integer arithmetic"). An input or dim a graph does not state is unbounded.
"""

from __future__ import annotations

import json
from typing import Mapping

import onnx

__all__ = ["RANGES_KEY", "Range", "declare_ranges", "declared_ranges"]

RANGES_KEY = "sf_trt.int_ranges"
Range = tuple[int, int]


def _checked(kind: str, ranges: Mapping[str, Range]) -> dict[str, list[int]]:
    out = {}
    for name, bounds in ranges.items():
        lo, hi = (int(v) for v in bounds)
        if lo > hi:
            raise ValueError(f"declare_ranges: {kind} {name!r} range [{lo}, {hi}] is empty")
        out[str(name)] = [lo, hi]
    return out


def declare_ranges(model: onnx.ModelProto, *, inputs: Mapping[str, Range] = {}, dims: Mapping[str, Range] = {}) -> onnx.ModelProto:
    """Record ``inputs`` (input name -> ``(lo, hi)``) and ``dims`` (dim name -> ``(lo, hi)``)
    in ``model``'s metadata, replacing any earlier record; returns ``model``."""
    graph_inputs = {i.name for i in model.graph.input}
    unknown = sorted(set(inputs) - graph_inputs)
    if unknown:
        raise ValueError(f"declare_ranges: {unknown} are not inputs of the graph (inputs: {sorted(graph_inputs)})")
    record = json.dumps({"inputs": _checked("input", inputs), "dims": _checked("dim", dims)}, sort_keys=True)
    kept = [p for p in model.metadata_props if p.key != RANGES_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=RANGES_KEY, value=record)
    return model


def declared_ranges(model: onnx.ModelProto) -> tuple[dict[str, Range], dict[str, Range]]:
    """``(inputs, dims)`` as :func:`declare_ranges` recorded them; empty where nothing is stated.
    A record that is not the JSON above raises ``ValueError`` naming what was found."""
    for p in model.metadata_props:
        if p.key == RANGES_KEY:
            try:
                record = json.loads(p.value)
                return tuple(  # type: ignore[return-value]
                    {str(k): (int(v[0]), int(v[1])) for k, v in record.get(part, {}).items()} for part in ("inputs", "dims")
                )
            except (ValueError, TypeError, IndexError, AttributeError) as exc:
                raise ValueError(f"metadata {RANGES_KEY!r} is not a ranges record ({exc}): {p.value[:200]!r}") from None
    return {}, {}
