"""Weight quantization for the decoder graph: symmetric int8 per output channel."""

from __future__ import annotations

import dataclasses

import numpy as np

from .gguf_llama import LlamaWeights

__all__ = ["quantize_int8", "int8_weights"]


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row of an ``[out, in]`` matrix: ``(q int8, scale float32 [out])``
    with ``w ~= q * scale[:, None]``."""
    w = np.asarray(w, dtype=np.float32)
    scale = (np.abs(w).max(axis=1) / 127.0).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def int8_weights(weights: LlamaWeights) -> LlamaWeights:
    """The float32 weights the ``weight_dtype="int8"`` graph computes with: every
    matrix replaced by its int8 dequantization (``q * scale``, as DequantizeLinear
    computes it); the embedding kept, the lm_head (then untied) quantized."""
    def deq(w: np.ndarray) -> np.ndarray:
        q, scale = quantize_int8(w)
        return q.astype(np.float32) * scale[:, None]

    mats = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    layers = [dataclasses.replace(layer, **{m: deq(getattr(layer, m)) for m in mats}) for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=deq(weights.output_matrix()))
