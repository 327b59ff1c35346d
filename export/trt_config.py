"""What a TensorRT build depends on besides the graph, and the settings it makes, as data.

:class:`BuildConfig` is what the user chooses (the one shape of every pass, the
workspace, the timing cache). :func:`build_settings` is a pure function from a
graph's kind and precision, its I/O, the shapes and the TensorRT version to the
frozen :class:`~sf_trt.formats.manifest.BuildSettings` that ``sf_trt.export.trt_build``
applies and the manifest records. It needs no TensorRT, so it is tested on any CPU:

* **strongly typed, always.** Precision is in the graph (``sf-trt export
  --precision``); the builder sets no precision flag (TensorRT 11 has none).
  TensorRT 10.x builds weakly typed networks unless ``STRONGLY_TYPED`` is given at
  network creation; 11.x is always strongly typed and deprecates the flag (ignored),
  so it is given on 10.x only.
* **no TF32.** ``TF32`` is on by default and lets float32 matmuls round their inputs
  to 10 mantissa bits: cleared for every engine, so fp32 graphs are fp32 and the
  float32 parts of reduced-precision graphs stay float32.
* **one fixed profile** (min = opt = max) from the graph's named dims and the
  shapes (:func:`sf_trt.formats.shapes.profile_of`): rows bit-identical however a
  pass is packed (docs/tensorrt.md).
* **distributive independence.** ``DISTRIBUTIVE_INDEPENDENCE`` (TensorRT 10.12+, 11.x)
  asks for identical results across a distributive axis (a batch of identical rows
  must give identical outputs: NVIDIA/TensorRT#4796 and #4853 report otherwise).
  Asked for on every engine; :func:`sf_trt.export.trt_build.build_engine` sets it by
  name where the installed TensorRT has it and records in the manifest whether it did.
* flags by **name**, never by value: TensorRT renumbered its enums between 10 and 11.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from sf_trt.backends.tensorrt.errors import TensorRTUnavailable
from sf_trt.backends.tensorrt.probes import check_tensorrt_version
from sf_trt.formats.manifest import BuildSettings
from sf_trt.formats.model_dir import PRECISIONS
from sf_trt.formats.shapes import IOTensor, ShapeError, ShapeLimits, profile_of

__all__ = [
    "BuildError", "BuildConfig", "DEFAULT_MAX_OPSET", "PRECISIONS", "GRAPH_KINDS", "EXACT_KINDS", "OPTIONAL_FLAGS",
    "graph_kind", "build_settings",
]

DEFAULT_MAX_OPSET = 20
"""[M]/[C] highest opset TensorRT 10.0 imports (10.15 goes to 24; pass ``max_opset``). Here, not in
:mod:`.trt_support` (which imports onnx), so that the command line's parser reads it cheaply."""

GRAPH_KINDS = ("decoder", "verify", "copy_model", "graph")
"""What a graph is, told by its inputs (:func:`graph_kind`); ``graph``: any other ONNX graph."""
EXACT_KINDS = frozenset({"verify", "copy_model"})
"""Kinds built from fp32 graphs only: the verify-and-sample graph decides tokens (top-p
sums, Gumbel argmax); the copy model's logits are exact by design."""


OPTIONAL_FLAGS = ("DISTRIBUTIVE_INDEPENDENCE",)
"""Builder flags set where the installed TensorRT has them and left out (the manifest then
says so) where it does not; any other flag the settings name must exist."""


class BuildError(Exception):
    """A build step refused its input; the message says what it got and expected."""


@dataclasses.dataclass(frozen=True)
class BuildConfig(ShapeLimits):
    """Everything a build depends on besides the graph: the one shape of every pass
    (:class:`~sf_trt.formats.shapes.ShapeLimits`) and how to build (the workspace
    limit, the timing cache file)."""

    workspace_bytes: int = 1 << 30
    timing_cache: str | None = None

    def __post_init__(self) -> None:
        value = self.workspace_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BuildError(f"BuildConfig: workspace_bytes must be an int >= 1 (got {value!r})")
        try:
            super().__post_init__()
        except ShapeError as exc:
            raise BuildError(str(exc)) from None

    @property
    def limits(self) -> ShapeLimits:
        return ShapeLimits(self.max_lanes, self.rows_per_lane, self.max_context)


def graph_kind(io: Iterable[IOTensor]) -> str:
    """The kind of graph with I/O ``io``: a decoder has ``past_key_0``, the verify graph
    ``noise_add``, the copy model ``history``; anything else is ``"graph"``."""
    names = {t.name for t in io if t.mode == "input"}
    for kind, marker in (("decoder", "past_key_0"), ("verify", "noise_add"), ("copy_model", "history")):
        if marker in names:
            return kind
    return "graph"


def build_settings(
    kind: str, precision: str, io: Iterable[IOTensor], limits: ShapeLimits, tensorrt_version: str, *,
    workspace_bytes: int = 1 << 30,
) -> BuildSettings:
    """The settings an engine of graph ``kind`` (:data:`GRAPH_KINDS`) and ``precision``
    (the graph's own, :data:`PRECISIONS`) with I/O ``io`` is built with, under the shapes
    ``limits``, by TensorRT ``tensorrt_version``. Pure; :class:`BuildError` names what
    cannot be built (an unknown kind or precision, a reduced-precision verify graph or
    copy model, an unsupported TensorRT, a dim no shape sizes)."""
    if kind not in GRAPH_KINDS:
        raise BuildError(f"build_settings: graph kind {kind!r} unknown (known: {', '.join(GRAPH_KINDS)})")
    if precision not in PRECISIONS:
        raise BuildError(f"build_settings: precision {precision!r} unknown (known: {', '.join(PRECISIONS)})")
    if kind in EXACT_KINDS and precision != "fp32":
        raise BuildError(f"build_settings: a {kind} graph is built from fp32 only (got {precision}): it decides tokens exactly")
    try:
        major, _ = check_tensorrt_version(tensorrt_version)
    except TensorRTUnavailable as exc:
        raise BuildError(str(exc)) from None
    try:
        profile = profile_of(io, limits)
    except ShapeError as exc:
        raise BuildError(str(exc)) from None
    return BuildSettings(
        kind=kind,
        precision=precision,
        tensorrt_version=str(tensorrt_version),
        # 10.x: weakly typed unless asked; 11.x: always strongly typed, the flag deprecated and ignored
        network_flags=("STRONGLY_TYPED",) if major == 10 else (),
        # precision is the graph's: no FP16/BF16 flags (11 has none); rows of a batch computed alike
        builder_flags_set=OPTIONAL_FLAGS,
        builder_flags_cleared=("TF32",),  # on by default; fp32 is fp32
        memory_pools=(("WORKSPACE", int(workspace_bytes)),),
        profiles=(profile,),
    )
