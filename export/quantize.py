"""Weight quantization for the decoder graph: symmetric int8 per output channel, and
the GGUF's own 4-bit (Q4_1) and 8-bit (Q8_0) blocks as onnxruntime's ``MatMulNBits`` takes them.

:class:`GgmlBlocks` is a matrix ``[out, in]`` kept in GGML's blocks of 32 along ``in``,
byte for byte as a GGUF stores it (``raw``): Q4_1 holds per block a float16 scale ``d``, a
float16 offset ``m`` and 32 four-bit values ``q`` (``w = d * q + m``); Q8_0 a float16 scale
and 32 int8 values (``w = d * q``). :meth:`GgmlBlocks.nbits` rewrites them, without
rounding anything, into ``MatMulNBits`` operands: the same 4- or 8-bit values (nibbles
reordered), the same scales, and for Q4_1 the offsets as a small float32 matrix the graph
applies to each block's sum of inputs (``MatMulNBits`` can carry a non-integer offset only
as a float zero point, which sends onnxruntime's CPU kernel to a path that dequantizes the
whole matrix on every run: measured 30x slower when this export was built).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .gguf_llama import LlamaWeights

__all__ = ["quantize_int8", "int8_weights", "GgmlBlocks", "BLOCK", "NBITS_KINDS"]

BLOCK = 32
"""Weights per GGML block (Q4_1 and Q8_0), along a matrix's input dim."""
NBITS_KINDS = {"Q4_1": 4, "Q8_0": 8}
"""The GGML block types carried into ``MatMulNBits``, and their bits."""
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


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


@dataclasses.dataclass(frozen=True)
class GgmlBlocks:
    """A matrix ``[out, in]`` in GGML blocks (module docstring): ``raw`` uint8
    ``[out, in / 32 * block bytes]``, as the GGUF stores it."""

    kind: str
    raw: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in NBITS_KINDS:
            raise ValueError(f"GgmlBlocks: kind {self.kind!r} unknown (known: {', '.join(NBITS_KINDS)})")
        if self.raw.dtype != np.uint8 or self.raw.ndim != 2 or self.raw.shape[1] % _BLOCK_BYTES[self.kind]:
            raise ValueError(f"GgmlBlocks: raw must be uint8 [out, blocks * {_BLOCK_BYTES[self.kind]}] (got {self.raw.dtype} {self.raw.shape})")

    @classmethod
    def quantize(cls, w: np.ndarray, kind: str) -> "GgmlBlocks":
        """``w`` ``[out, in]`` (``in`` a multiple of 32) quantized to ``kind`` as ggml does."""
        import gguf

        w = np.ascontiguousarray(w, dtype=np.float32)
        return cls(kind, np.ascontiguousarray(gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])))

    @classmethod
    def concat(cls, parts: list["GgmlBlocks"]) -> "GgmlBlocks":
        """The rows of ``parts`` one after another (one matrix of their outputs): blocks of one kind."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"GgmlBlocks.concat: parts of kinds {sorted(kinds)}; expected one kind")
        return cls(parts[0].kind, np.concatenate([p.raw for p in parts], axis=0))

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)``."""
        return self.raw.shape[0], self.raw.shape[1] // _BLOCK_BYTES[self.kind] * BLOCK

    @property
    def bits(self) -> int:
        return NBITS_KINDS[self.kind]

    def _fields(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(d float32 [out, nb], m float32 [out, nb] or None, q uint8 [out, nb, 32])`` (Q8_0's q
        as uint8 ``q + 128``)."""
        out, nb = self.raw.shape[0], self.shape[1] // BLOCK
        blocks = self.raw.reshape(out, nb, _BLOCK_BYTES[self.kind])
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        if self.kind == "Q8_0":
            q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            return d, None, q
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        packed = blocks[..., 4:]  # byte j: value j (low nibble), value j + 16 (high nibble)
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        return d, m, q

    def dequantize(self) -> np.ndarray:
        """float32 ``[out, in]``: ``d * q + m`` (Q4_1), ``d * q`` (Q8_0), as gguf computes it."""
        d, m, q = self._fields()
        if m is None:
            w = (q.astype(np.float32) - 128.0) * d[..., None]
        else:
            w = d[..., None] * q.astype(np.float32) + m[..., None]
        return w.reshape(self.shape)

    def nbits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``MatMulNBits`` operands for ``x @ w.T``: ``(b uint8 [out, nb, 32 * bits / 8], scales float32
        [out * nb], offsets float32 [nb, out] or None)``.

        ``MatMulNBits`` (default zero point ``2 ** (bits - 1)``) computes ``(b - zp) * scale``;
        Q8_0's values are stored as ``q + 128`` (exact), Q4_1's as they are, so it computes
        ``d * (q - 8)`` and the graph adds ``sum(x over the block) * (m + 8 d)`` per block:
        ``d * q + m`` exactly in real arithmetic, no value rounded to another grid."""
        d, m, q = self._fields()
        out, nb = d.shape
        if self.bits == 8:
            return np.ascontiguousarray(q), np.ascontiguousarray(d.reshape(-1)), None
        b = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)  # MatMulNBits: values 2i, 2i+1 in byte i
        offsets = (m + np.float32(8.0) * d).T  # [nb, out]
        return np.ascontiguousarray(b), np.ascontiguousarray(d.reshape(-1)), np.ascontiguousarray(offsets, dtype=np.float32)


def blocks_for(weights: LlamaWeights, keys: list[str], w: np.ndarray, kind: str) -> GgmlBlocks:
    """The matrix ``w`` (the matrices ``keys`` of :attr:`LlamaWeights.blocks` stacked by output) in
    ``kind`` blocks: the GGUF's own bytes when it stores every part so, else ``w`` quantized as
    ggml would. ``ValueError`` when ``w``'s input dim is not whole blocks."""
    found = [weights.blocks.get(k) for k in keys]
    if all(f is not None and f[0] == kind for f in found):
        return GgmlBlocks.concat([GgmlBlocks(*f) for f in found])
    if w.shape[1] % BLOCK:
        raise ValueError(f"{kind} blocks: an input dim of {w.shape[1]} is not a multiple of {BLOCK} ({', '.join(keys)})")
    return GgmlBlocks.quantize(w, kind)


Q4_LAYER_KIND, Q4_HEAD_KIND = "Q4_1", "Q8_0"
"""The ``weights="q4"`` export: every layer matrix in Q4_1 blocks; the token embedding and the
lm_head in Q8_0 blocks."""
_MATS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def q4_weights(weights: LlamaWeights) -> LlamaWeights:
    """The float32 weights the ``weight_dtype="q4"`` graph computes with (as :func:`int8_weights`
    for int8): each layer matrix its Q4_1 blocks' values, the embedding and the lm_head their
    Q8_0 blocks' values; for a GGUF that stores them so, exactly its own dequantized weights."""
    layers = [
        dataclasses.replace(layer, **{m: blocks_for(weights, [f"layers.{i}.{m}"], getattr(layer, m), Q4_LAYER_KIND).dequantize() for m in _MATS})
        for i, layer in enumerate(weights.layers)
    ]
    embd = blocks_for(weights, ["tok_embd"], weights.tok_embd, Q4_HEAD_KIND).dequantize()
    head = None if weights.lm_head is None else blocks_for(weights, ["lm_head"], weights.lm_head, Q4_HEAD_KIND).dequantize()
    return dataclasses.replace(weights, tok_embd=embd, layers=layers, lm_head=head, blocks={})
