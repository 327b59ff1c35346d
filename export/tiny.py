"""Tiny random decoders of every family (2 layers, GQA 4:2, head_dim 16, vocab 256) for fast tests and checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from sf_trt.formats.model_dir import LlamaConfig

from .families import BIAS_FIELDS, family
from .gguf_llama import LlamaLayerWeights, LlamaWeights, layer_shapes

__all__ = ["tiny_llama_config", "tiny_family_config", "random_llama_weights", "TINY_FAMILY_CONFIGS"]


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """A small Llama (2 layers, GQA 4:2, head_dim 16, vocab 256) for fast tests."""
    base = dict(
        n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128, vocab=256,
        rope_theta=10000.0, rms_eps=1e-5, context_length=512, tied_embeddings=True, bos=1, eos=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


TINY_FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": dict(sliding_window=8, sliding_layers=(0, 1), tied_embeddings=False),
    "qwen2": dict(rope_theta=1000000.0),
    "qwen3": dict(head_dim=32),  # head_dim * heads != hidden, as Qwen3's
    "gemma3": dict(n_heads=4, n_kv_heads=1, sliding_window=8, sliding_layers=(0,), rope_theta=1000000.0, rope_local_theta=10000.0,
                   query_scale=float(24.0 ** -0.5), rms_eps=1e-6),
    "phi3": dict(n_kv_heads=4, sliding_window=16, sliding_layers=(0, 1), tied_embeddings=False),
}
"""How each family's tiny config differs from :func:`tiny_llama_config` (windows short enough that a
test's sequences slide past them)."""


def tiny_family_config(arch: str, **overrides: Any) -> LlamaConfig:
    """The tiny config of family ``arch`` (:data:`TINY_FAMILY_CONFIGS`)."""
    return tiny_llama_config(arch=arch, **{**TINY_FAMILY_CONFIGS[arch], **overrides})


def random_llama_weights(cfg: LlamaConfig, seed: int = 0, *, biases: bool = False, rope_factors: bool = False) -> LlamaWeights:
    """Random float32 weights of ``cfg``'s shapes and family, scaled so activations stay O(1);
    ``biases``: every bias the family may hold; ``rope_factors``: Llama 3's rope divisors
    (from 1 to 8 over the frequencies)."""
    rng = np.random.default_rng(seed)
    fam = family(cfg.arch)
    shapes = layer_shapes(cfg)

    def value(name: str) -> np.ndarray:
        shape = shapes[name]
        if len(shape) == 2:
            return (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        if name in BIAS_FIELDS:
            return (0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)  # a norm

    fields = [f for f in fam.layer_fields if f in fam.required or (biases and f in BIAS_FIELDS)]
    layers = [LlamaLayerWeights(**{f: value(f) for f in fields}) for _ in range(cfg.n_layers)]
    embd = rng.standard_normal((cfg.vocab, cfg.hidden)).astype(np.float32)
    lm_head = None if cfg.tied_embeddings else (rng.standard_normal((cfg.vocab, cfg.hidden)) / np.sqrt(cfg.hidden)).astype(np.float32)
    norm = (1.0 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32)
    factors = np.geomspace(1.0, 8.0, cfg.head_dim // 2).astype(np.float32) if rope_factors else None
    return LlamaWeights(tok_embd=embd, layers=layers, output_norm=norm, lm_head=lm_head, rope_factors=factors)
