"""The graphs export/ builds, each with a small configuration for checks and tests.

``GRAPHS[name]()`` returns an ``onnx.ModelProto``. Tests and ``sf-trt build --check``
iterate over it, so every graph export/ can build is checked on every backend present.
Builders import lazily: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Callable

import onnx


def _verify() -> onnx.ModelProto:
    from .verify import build_verify_graph

    return build_verify_graph(vocab=512, top_k_limit=64)


def _copy_model() -> onnx.ModelProto:
    from .copy_model import build_copy_graph

    return build_copy_graph(vocab=512, eos=511, max_lanes=4, max_context=128, copy_miss_every=3)


def _decoder() -> onnx.ModelProto:
    from .decoder import build_decoder_graph, tiny_llama_config, random_llama_weights

    cfg = tiny_llama_config()
    return build_decoder_graph(cfg, random_llama_weights(cfg, seed=0), max_lanes=2, max_context=64)


GRAPHS: dict[str, Callable[[], onnx.ModelProto]] = {
    "verify": _verify,
    "copy_model": _copy_model,
    "decoder": _decoder,
}
