"""The graphs sf_trt builds, each with a small configuration for checks and tests.

``GRAPHS[name]()`` returns an ``onnx.ModelProto``. Tests and ``sf-trt build --check``
iterate over it, so every graph sf_trt can build is checked on every backend present.
Builders import lazily: importing this module costs nothing.
"""

from __future__ import annotations

from typing import Callable

import onnx

__all__ = ["GRAPHS", "BUILDERS"]


def _verify() -> onnx.ModelProto:
    from sf_trt.graphs.verify import build_verify_graph

    return build_verify_graph(vocab=512, top_k_limit=64)


def _logprobs() -> onnx.ModelProto:
    from sf_trt.graphs.logprobs import build_logprobs_graph

    return build_logprobs_graph(vocab=500)


def _adjust() -> onnx.ModelProto:
    from sf_trt.graphs.adjust import build_adjust_graph

    return build_adjust_graph(vocab=500)


def _copy_model() -> onnx.ModelProto:
    from sf_trt.graphs.copy_model import build_copy_graph

    return build_copy_graph(vocab=512, eos=511, max_lanes=4, max_context=128, copy_miss_every=3)


def _decoder(arch: str = "llama") -> Callable[[], onnx.ModelProto]:
    def build() -> onnx.ModelProto:
        from .decoder_graph import build_decoder_graph
        from .tiny import random_llama_weights, tiny_family_config

        cfg = tiny_family_config(arch)
        weights = random_llama_weights(cfg, seed=0, biases=arch == "llama", rope_factors=arch == "llama")
        return build_decoder_graph(cfg, weights)  # symbolic caches, as an export writes them

    return build


FAMILY_DECODERS = ("mistral", "qwen2", "qwen3", "gemma3", "phi3")
"""The families whose decoders the registry holds beside llama's (``decoder_<family>``)."""

GRAPHS: dict[str, Callable[[], onnx.ModelProto]] = {
    "verify": _verify,
    "logprobs": _logprobs,
    "adjust": _adjust,
    "copy_model": _copy_model,
    "decoder": _decoder(),
    **{f"decoder_{arch}": _decoder(arch) for arch in FAMILY_DECODERS},
}

BUILDERS: dict[str, str] = {
    "verify": "sf_trt.graphs.verify",
    "logprobs": "sf_trt.graphs.logprobs",
    "adjust": "sf_trt.graphs.adjust",
    "copy_model": "sf_trt.graphs.copy_model",
    "decoder": "sf_trt.export.decoder_graph",
    **{f"decoder_{arch}": "sf_trt.export.decoder_graph" for arch in FAMILY_DECODERS},
}
"""The module that builds each graph (where its op notes live)."""
