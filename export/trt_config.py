"""What a TensorRT build depends on besides the graph: :class:`BuildConfig`."""

from __future__ import annotations

import dataclasses

from sf_trt.formats.shapes import ShapeError, ShapeLimits

__all__ = ["BuildError", "BuildConfig", "PRECISIONS", "EXACT_GRAPHS", "precision_for"]

PRECISIONS = ("fp32", "fp16", "bf16")

EXACT_GRAPHS = frozenset({"verify"})
"""Graphs built in fp32 whatever ``--precision`` says: the verify-and-sample
graph decides tokens (top-p cumulative sums, Gumbel argmax), and reduced
precision there changes which token wins; it is cheap next to the decoder."""


class BuildError(Exception):
    """A build step refused its input; the message says what it got and expected."""


@dataclasses.dataclass(frozen=True)
class BuildConfig(ShapeLimits):
    """Everything a build depends on besides the graph: the shape limits
    (:class:`~sf_trt.formats.shapes.ShapeLimits`, which bound the profile's dims
    by role) and how to build (precision, workspace, timing cache)."""

    precision: str = "fp16"
    workspace_bytes: int = 1 << 30
    timing_cache: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise BuildError(f"BuildConfig: precision {self.precision!r}, expected one of {list(PRECISIONS)}")
        value = self.workspace_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BuildError(f"BuildConfig: workspace_bytes must be an int >= 1 (got {value!r})")
        try:
            super().__post_init__()
        except ShapeError as exc:
            raise BuildError(str(exc)) from None

    def with_precision(self, precision: str) -> "BuildConfig":
        return dataclasses.replace(self, precision=precision)


def precision_for(name: str, cfg: BuildConfig) -> str:
    """The precision graph ``name`` is built in (fp32 for :data:`EXACT_GRAPHS`)."""
    return "fp32" if name in EXACT_GRAPHS else cfg.precision
