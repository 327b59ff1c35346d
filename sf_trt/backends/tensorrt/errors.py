"""What the TensorRT backend raises."""

from __future__ import annotations

from ...abi import Status, StatusError

__all__ = ["TensorRTError", "TensorRTUnavailable", "refuse"]


class TensorRTError(RuntimeError):
    """TensorRT or CUDA failed while running (a call returned False, an engine
    would not deserialize). Not a refusal of input: those are StatusErrors,
    raised before anything runs."""


class TensorRTUnavailable(RuntimeError):
    """TensorRT, torch with CUDA, or a GPU is missing here; the message says which and why."""


def refuse(what: str) -> StatusError:
    """A refusal of the TensorRT backend (``UNSUPPORTED``), naming what was wrong."""
    return StatusError(Status.UNSUPPORTED, f"TensorRTPrimitives: {what}")
