"""Engine runners (sf_trt.backends.tensorrt.runners): what runs without a GPU.

The CUDA-graph capture itself needs a GPU (tools/trt_device_check.py (e)); its policy does
not: a refused capture leaves one warning line and the runner enqueues plainly after.
"""

from __future__ import annotations

from sf_trt.backends.tensorrt.runners import CaptureRefused, capture_or_none


def test_a_refused_capture_is_one_warning_line_and_no_graph():
    lines = []

    def refused():
        raise CaptureRefused("execute_async_v3 returned False while capturing")

    assert capture_or_none("decoder", refused, lines.append) is None
    assert lines == ["sf_trt: warning: decoder: CUDA graph capture failed (execute_async_v3 returned False while capturing); running without CUDA graphs"]


def test_a_capture_that_succeeds_is_kept_without_a_word():
    lines = []
    assert capture_or_none("verify", lambda: "the graph", lines.append) == "the graph"
    assert lines == []
