"""The decoder in numpy float64: what the exported graphs are checked against."""

from __future__ import annotations

import numpy as np

from sf_trt.formats.model_dir import LlamaConfig

from .gguf_llama import LlamaWeights

__all__ = ["reference_forward"]


def reference_forward(
    cfg: LlamaConfig,
    weights: LlamaWeights,
    tokens,
    positions=None,
    *,
    rope: str = "interleaved",
) -> np.ndarray:
    """Float64 logits ``[n, vocab]`` of a causal pass over ``tokens`` (one sequence).

    ``positions`` default to ``0..n-1``. ``rope="interleaved"`` is the convention
    the GGUF q/k rows need; ``"half"`` (HF's ``rotate_half``) is there to show the
    other one is wrong for them (and right after :func:`unpermute_rotary_rows`).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.shape[0]
    pos = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
    nh, nkv, hd, grp = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
    half = hd // 2
    inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [n, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rot(x: np.ndarray) -> np.ndarray:  # x [n, heads, hd]
        if rope == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * c - b * s
            out[..., 1::2] = a * s + b * c
            return out
        if rope == "half":
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        raise ValueError(f"reference_forward: rope must be 'interleaved' or 'half' (got {rope!r})")

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps) * w.astype(np.float64)

    def lin(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x @ w.astype(np.float64).T

    causal = pos[None, :] <= pos[:, None]  # [query, key]
    x = weights.tok_embd[tokens].astype(np.float64)
    for layer in weights.layers:
        h = norm(x, layer.attn_norm)
        q = rot(lin(h, layer.wq).reshape(n, nh, hd))
        k = rot(lin(h, layer.wk).reshape(n, nkv, hd))
        v = lin(h, layer.wv).reshape(n, nkv, hd)
        k, v = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)  # q head h uses kv head h // grp
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(causal[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, nh * hd)
        x = x + lin(attn, layer.wo)
        h = norm(x, layer.ffn_norm)
        gate = lin(h, layer.w_gate)
        x = x + lin(gate / (1.0 + np.exp(-gate)) * lin(h, layer.w_up), layer.w_down)
    return lin(norm(x, weights.output_norm), weights.output_matrix())
