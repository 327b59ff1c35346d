"""A tiny random Llama (2 layers, GQA 4:2, head_dim 16, vocab 256) for fast tests and checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from sf_trt.formats.model_dir import LlamaConfig

from .gguf_llama import LlamaLayerWeights, LlamaWeights

__all__ = ["tiny_llama_config", "random_llama_weights"]


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """A small Llama (2 layers, GQA 4:2, head_dim 16, vocab 256) for fast tests."""
    base = dict(
        n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128, vocab=256,
        rope_theta=10000.0, rms_eps=1e-5, context_length=512, tied_embeddings=True, bos=1, eos=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def random_llama_weights(cfg: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Random float32 weights of ``cfg``'s shapes, scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)

    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32)

    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layers = [
        LlamaLayerWeights(
            attn_norm=norm(), wq=mat(q, cfg.hidden), wk=mat(kv, cfg.hidden), wv=mat(kv, cfg.hidden),
            wo=mat(cfg.hidden, q), ffn_norm=norm(), w_gate=mat(cfg.ffn, cfg.hidden),
            w_up=mat(cfg.ffn, cfg.hidden), w_down=mat(cfg.hidden, cfg.ffn),
        )
        for _ in range(cfg.n_layers)
    ]
    embd = rng.standard_normal((cfg.vocab, cfg.hidden)).astype(np.float32)
    lm_head = None if cfg.tied_embeddings else mat(cfg.vocab, cfg.hidden)
    return LlamaWeights(tok_embd=embd, layers=layers, output_norm=norm(), lm_head=lm_head)
