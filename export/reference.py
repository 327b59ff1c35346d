"""The decoder in numpy float64, every family (:mod:`.families`): what the exported graphs are checked against."""

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
    from .decoder_graph import inverse_frequencies
    from .families import family

    fam = family(cfg.arch)
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.shape[0]
    pos = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
    nh, nkv, hd, grp = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
    half = hd // 2

    def tables(theta=None, factors=None):
        ang = pos[:, None].astype(np.float64) * inverse_frequencies(cfg, theta, factors)[None, :]  # [n, half]
        return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    rope_global = tables(factors=weights.rope_factors)
    rope_local = tables(theta=cfg.rope_local_theta) if cfg.rope_local_theta else rope_global

    def rot(x: np.ndarray, cs) -> np.ndarray:  # x [n, heads, hd]
        c, s = cs
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

    def lin(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        y = x @ w.astype(np.float64).T
        return y if b is None else y + b.astype(np.float64)

    def act(x: np.ndarray) -> np.ndarray:
        if fam.activation == "silu":
            return x / (1.0 + np.exp(-x))
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))

    causal = pos[None, :] <= pos[:, None]  # [query, key]
    window = causal & (pos[None, :] > pos[:, None] - cfg.sliding_window)
    x = weights.tok_embd[tokens].astype(np.float64)
    if fam.embed_scale:
        x = x * float(np.float32(np.sqrt(cfg.hidden)))
    for i, layer in enumerate(weights.layers):
        local = cfg.slides(i)
        cs = rope_local if local else rope_global
        h = norm(x, layer.attn_norm)
        q = lin(h, layer.wq, layer.bq).reshape(n, nh, hd)
        k = lin(h, layer.wk, layer.bk).reshape(n, nkv, hd)
        if layer.q_norm is not None:
            q, k = norm(q, layer.q_norm), norm(k, layer.k_norm)
        q, k = rot(q, cs), rot(k, cs)
        v = lin(h, layer.wv, layer.bv).reshape(n, nkv, hd)
        k, v = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)  # q head h uses kv head h // grp
        scores = np.einsum("qhd,khd->hqk", q, k) * cfg.scale
        scores = np.where((window if local else causal)[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, nh * hd)
        out = lin(attn, layer.wo, layer.bo)
        x = x + (out if layer.post_attn_norm is None else norm(out, layer.post_attn_norm))
        h = norm(x, layer.ffn_norm)
        out = lin(act(lin(h, layer.w_gate, layer.b_gate)) * lin(h, layer.w_up, layer.b_up), layer.w_down, layer.b_down)
        x = x + (out if layer.post_ffn_norm is None else norm(out, layer.post_ffn_norm))
    return lin(norm(x, weights.output_norm), weights.output_matrix())
