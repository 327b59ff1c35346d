"""onnxruntime's profiler output, read one way for the tools that profile the decoder pass."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def kernel_us_by_op(profile: Path, *, skip_runs: int = 0) -> Counter:
    """Microseconds of kernel time per op type in the profile JSON ``profile``
    (``session.end_profiling()``'s file), leaving out the session's first ``skip_runs`` runs."""
    events = json.loads(Path(profile).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    since = runs[skip_runs] if skip_runs else 0
    kernel: Counter = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= since:
            kernel[e["args"]["op_name"]] += e["dur"]
    return kernel
