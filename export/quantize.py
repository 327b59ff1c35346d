"""Weight quantization for the decoder graph: symmetric int8 per output channel, and 4-bit (and
8-bit) blocks as onnxruntime's ``MatMulNBits`` takes them, from a GGUF's own blocks where it can.

:class:`GgmlBlocks` is a matrix ``[out, in]`` kept in GGML's blocks along ``in``, byte for byte as
a GGUF stores it (``raw``). Q4_0 holds per block of 32 a float16 scale ``d`` and 32 four-bit
values ``q`` (``w = d * (q - 8)``); Q4_1 a scale ``d``, a float16 offset ``m`` and 32 four-bit values
(``w = d * q + m``); Q4_K, per super-block of 256, float16 ``d`` and ``dmin`` and per sub-block of 32
a 6-bit scale ``sc`` and min ``mn`` (``w = d sc q - dmin mn``); Q8_0 a scale and 32 int8 values
(``w = d * q``). :meth:`GgmlBlocks.nbits` rewrites them, without rounding any value to another
grid, into an :class:`NBitsMatrix` (``w = scale * (q - zero) + offset`` per block of 32): the same
4- or 8-bit values (nibbles reordered), the same scales (Q4_K's ``d * sc``, exact in float32), and
for Q4_1 and Q4_K an offset per block that the graph applies to each block's sum of inputs.

Every other matrix (Q5_0, Q5_1, Q5_K, Q6_K and, for the layer matrices, Q8_0; F16, F32, and a
checkpoint's weights) ``weights="q4"`` requantizes from its float32 values (:func:`requantize_4bit`:
4 bits per block of 32, asymmetric, a uint8 zero point), so each matrix is one ``MatMulNBits``.
``tools/q4_error.py`` prints, per GGUF type, how far that holds a file's matrices from its values.
``weights="gguf"`` changes no value instead (:func:`gguf_bits`): the 5-, 6- and 8-bit blocks in
8 bits (:func:`eight_bit`), a fused matrix widened to 8 bits where any part is. ``weights="int4"``
requantizes every matrix, 4-bit blocks and the lm_head included (:func:`int4_bits`): onnxruntime-genai's
int4 form, the fewest bytes a token and no offsets to apply, at the cost of a second rounding.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .gguf_llama import LlamaWeights

__all__ = [
    "quantize_int8", "int8_weights", "GgmlBlocks", "NBitsMatrix", "BLOCK", "CARRIED_KINDS", "four_bit",
    "requantize_4bit", "requantization_error", "q4_weights", "eight_bit", "gguf_bits", "int4_bits", "nbits_for", "output_bits",
]

BLOCK = 32
"""Weights per block of ``MatMulNBits`` here (and per GGML block, or K-quant sub-block), along a
matrix's input dim."""
CARRIED_KINDS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q8_0": 8}
"""The GGML block types carried into ``MatMulNBits`` losslessly, and their bits."""
_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
"""Bytes per GGML block (32 weights; 256 for the K-quants) of the types a GGUF's matrices are kept in."""
_BLOCK_WEIGHTS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256}


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
class NBitsMatrix:
    """A matrix ``[out, in]`` as ``MatMulNBits`` operands, per block of ``BLOCK`` inputs:
    ``w = scale * (q - zero) + offset``. ``q`` uint8 ``[out, nb, BLOCK]`` (values below
    ``2 ** bits``, unpacked), ``scales`` float32 ``[out, nb]``, ``zeros`` uint8 ``[out, nb]``
    (None: ``MatMulNBits``' default ``2 ** (bits - 1)``), ``offsets`` float32 ``[out, nb]`` (None:
    0). ``MatMulNBits`` computes ``scale * (q - zero)``; a non-zero offset (one that is not a whole
    number of steps: Q4_1's ``m``, Q4_K's mins) the graph adds as each block's input sum times
    ``offset`` (``MatMulNBits`` takes a non-integer offset only as a float zero point, which
    sends onnxruntime's CPU kernel to a path that dequantizes the whole matrix on every run:
    measured 30x slower when this export was built, 200x and not row-exact on onnxruntime 1.32:
    ``tools/bench_nbits_zero_points.py``)."""

    bits: int
    q: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None = None
    offsets: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * self.q.shape[2]

    @property
    def block(self) -> int:
        """Weights per block (32; 16 for Q6_K's sub-blocks)."""
        return self.q.shape[2]

    def widened(self) -> "NBitsMatrix":
        """The same values in 8 bits (zero point and values moved by 120: exact)."""
        if self.bits == 8:
            return self
        zeros = None if self.zeros is None else self.zeros + np.uint8(120)
        return NBitsMatrix(8, self.q + np.uint8(120), self.scales, zeros, self.offsets)

    def in_blocks_of(self, block: int) -> "NBitsMatrix":
        """The same values in blocks of ``block`` (a divisor of :attr:`block`: each block's scale,
        zero point and offset repeated over its parts; exact)."""
        if block == self.block:
            return self
        r = self.block // block
        out, nb = self.scales.shape
        rep = lambda a: None if a is None else np.repeat(a, r, axis=1)  # noqa: E731
        return NBitsMatrix(self.bits, self.q.reshape(out, nb * r, block), rep(self.scales), rep(self.zeros), rep(self.offsets))

    def packed(self) -> np.ndarray:
        """``q`` as ``MatMulNBits``' B: uint8 ``[out, nb, BLOCK * bits / 8]`` (4 bits: values
        ``2i`` and ``2i + 1`` in byte ``i``, low nibble first)."""
        if self.bits == 8:
            return np.ascontiguousarray(self.q)
        return np.ascontiguousarray(self.q[..., 0::2] | (self.q[..., 1::2] << 4), dtype=np.uint8)

    def packed_zeros(self) -> np.ndarray | None:
        """``zeros`` as ``MatMulNBits``' zero_points: uint8 ``[out * ceil(nb * bits / 8)]``."""
        if self.zeros is None:
            return None
        z = self.zeros
        if self.bits == 4:
            if z.shape[1] % 2:
                z = np.concatenate([z, np.zeros((z.shape[0], 1), np.uint8)], axis=1)
            z = z[:, 0::2] | (z[:, 1::2] << 4)
        return np.ascontiguousarray(z, dtype=np.uint8).reshape(-1)

    def dequantize(self) -> np.ndarray:
        """float32 ``[out, in]``: the weights the graph computes with."""
        zero = np.float32(2 ** (self.bits - 1)) if self.zeros is None else self.zeros.astype(np.float32)[..., None]
        w = self.scales[..., None] * (self.q.astype(np.float32) - zero)
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.reshape(self.shape).astype(np.float32)

    @classmethod
    def concat(cls, parts: list["NBitsMatrix"]) -> "NBitsMatrix":
        """The rows of ``parts`` one after another (one matrix of their outputs), all of one bit width,
        in the smallest block among them."""
        bits = {p.bits for p in parts}
        if len(bits) != 1:
            raise ValueError(f"NBitsMatrix.concat: parts of {sorted(bits)} bits; expected one width")
        if len(parts) == 1:
            return parts[0]
        block = min(p.block for p in parts)
        parts = [p.in_blocks_of(block) for p in parts]
        default = 2 ** (parts[0].bits - 1)
        zeros = offsets = None
        if any(p.zeros is not None for p in parts):
            zeros = np.concatenate([np.full(p.scales.shape, default, np.uint8) if p.zeros is None else p.zeros for p in parts])
        if any(p.offsets is not None for p in parts):
            offsets = np.concatenate([np.zeros(p.scales.shape, np.float32) if p.offsets is None else p.offsets for p in parts])
        cat = lambda f: np.concatenate([getattr(p, f) for p in parts])  # noqa: E731
        return cls(parts[0].bits, cat("q"), cat("scales"), zeros, offsets)


def requantize_4bit(w: np.ndarray) -> NBitsMatrix:
    """``w`` ``[out, in]`` (``in`` a multiple of ``BLOCK``) in 4 bits per block of 32, asymmetric:
    the block's range (widened to hold 0) in 15 steps, ``zero`` the step nearest 0 (a uint8 zero
    point, so one ``MatMulNBits`` computes it, no offsets)."""
    w = np.asarray(w, dtype=np.float32)
    out, k = w.shape
    if k % BLOCK:
        raise ValueError(f"requantize_4bit: an input dim of {k} is not a multiple of {BLOCK}")
    wb = w.reshape(out, k // BLOCK, BLOCK)
    lo, hi = np.minimum(wb.min(axis=-1), 0), np.maximum(wb.max(axis=-1), 0)
    scales = ((hi - lo) / np.float32(15)).astype(np.float32)
    scales[scales == 0] = 1.0
    zeros = np.clip(np.rint(-lo / scales), 0, 15)
    q = np.clip(np.rint(wb / scales[..., None]) + zeros[..., None], 0, 15)
    return NBitsMatrix(4, q.astype(np.uint8), scales, zeros.astype(np.uint8))


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes of 6-bit scales and mins -> ``(scales, mins)`` uint8 ``[..., 8]``, one per sub-block."""
    p = packed.astype(np.uint8)
    sc = np.empty(p.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4], mn[..., :4] = p[..., 0:4] & 63, p[..., 4:8] & 63
    sc[..., 4:] = (p[..., 8:12] & 0x0F) | ((p[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (p[..., 8:12] >> 4) | ((p[..., 4:8] >> 6) << 4)
    return sc, mn


def _f16(b: np.ndarray) -> np.ndarray:
    """float32 of little-endian float16 bytes ``[..., 2]``."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


@dataclasses.dataclass(frozen=True)
class GgmlBlocks:
    """A matrix ``[out, in]`` in GGML blocks (module docstring): ``raw`` uint8
    ``[out, in / block weights * block bytes]``, as the GGUF stores it."""

    kind: str
    raw: np.ndarray

    def __post_init__(self) -> None:
        if self.kind not in _BLOCK_BYTES:
            raise ValueError(f"GgmlBlocks: kind {self.kind!r} unknown (known: {', '.join(_BLOCK_BYTES)})")
        if self.raw.dtype != np.uint8 or self.raw.ndim != 2 or self.raw.shape[1] % _BLOCK_BYTES[self.kind]:
            raise ValueError(f"GgmlBlocks: raw must be uint8 [out, blocks * {_BLOCK_BYTES[self.kind]}] (got {self.raw.dtype} {self.raw.shape})")

    @classmethod
    def quantize(cls, w: np.ndarray, kind: str) -> "GgmlBlocks":
        """``w`` ``[out, in]`` (``in`` a multiple of 32) quantized to ``kind`` as ggml does (the
        types gguf can quantize: not the K-quants)."""
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
        return self.raw.shape[0], self.raw.shape[1] // _BLOCK_BYTES[self.kind] * _BLOCK_WEIGHTS.get(self.kind, BLOCK)

    @property
    def bits(self) -> int:
        return CARRIED_KINDS[self.kind]

    def dequantize(self) -> np.ndarray:
        """float32 ``[out, in]``, as gguf (ggml) computes it."""
        import gguf

        w = gguf.quants.dequantize(self.raw, gguf.GGMLQuantizationType[self.kind])
        return np.ascontiguousarray(w, dtype=np.float32).reshape(self.shape)

    def nbits(self) -> NBitsMatrix:
        """The blocks as ``MatMulNBits`` operands, no value rounded to another grid (the carried
        kinds only): Q8_0's values as ``q + 128`` at the default zero point 128; Q4_0's as they
        are (``d * (q - 8)``: zero point 8); Q4_1's ``d * q + m`` as ``d * (q - 8)`` plus the offset
        ``m + 8 d``; Q4_K's sub-blocks of 32 likewise, scale ``d * sc`` and offset
        ``8 d sc - dmin m`` (6-bit ``sc`` and ``m`` times float16 ``d`` and ``dmin``: exact in float32)."""
        if self.kind not in CARRIED_KINDS:
            raise ValueError(f"GgmlBlocks.nbits: {self.kind} blocks are not carried as they are (carried: {', '.join(CARRIED_KINDS)})")
        out, k = self.shape
        nb = k // BLOCK
        if self.kind == "Q4_K":
            blocks = self.raw.reshape(out, k // 256, 144)
            d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
            sc, mn = _k_scales(blocks[..., 4:16])
            packed = blocks[..., 16:].reshape(out, k // 256, 4, 32)  # 64 weights per 32 bytes: low nibbles, then high
            q = np.stack([packed & 0x0F, packed >> 4], axis=3).reshape(out, nb, BLOCK)
            scales = (d[..., None] * sc).reshape(out, nb)
            mins = (dmin[..., None] * mn).reshape(out, nb)
            return NBitsMatrix(4, q, scales, None, (np.float32(8.0) * scales - mins).astype(np.float32))
        blocks = self.raw.reshape(out, nb, _BLOCK_BYTES[self.kind])
        d = _f16(blocks[..., 0:2])
        if self.kind == "Q8_0":
            return NBitsMatrix(8, (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), d)
        packed = blocks[..., 4:] if self.kind == "Q4_1" else blocks[..., 2:]  # byte j: value j (low nibble), j + 16 (high)
        q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        if self.kind == "Q4_0":
            return NBitsMatrix(4, q, d)
        return NBitsMatrix(4, q, d, None, (_f16(blocks[..., 2:4]) + np.float32(8.0) * d).astype(np.float32))


def _bits_at(packed: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Bit ``index`` (little-endian across the bytes) of each row of ``packed`` ``[..., bytes]``."""
    return (packed[..., index // 8] >> (index % 8).astype(np.uint8)) & 1


def eight_bit(blocks: GgmlBlocks) -> NBitsMatrix:
    """Any carried or 5-/6-bit GGML blocks as ``MatMulNBits`` 8-bit operands, no value rounded
    (default zero point 128): the 4-bit kinds widened; Q5_0 (``d * (q - 16)``) as ``q + 112``; Q5_1
    (``d * q + m``) and Q5_K (sub-blocks of 32, ``d sc q - dmin mn``) as ``q + 128`` with their
    offsets; Q6_K (sub-blocks of 16, ``d sc (q - 32)``, ``sc`` int8) as ``q + 96`` in blocks of 16."""
    kind, raw = blocks.kind, blocks.raw
    out, k = blocks.shape
    if kind in CARRIED_KINDS:
        return blocks.nbits().widened()
    if kind in ("Q5_0", "Q5_1"):
        b = raw.reshape(out, k // BLOCK, _BLOCK_BYTES[kind])
        d = _f16(b[..., 0:2])
        at = 2 if kind == "Q5_0" else 4
        qh, qs = b[..., at:at + 4], b[..., at + 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (_bits_at(qh, np.arange(BLOCK)) << 4)
        if kind == "Q5_0":
            return NBitsMatrix(8, (q + 112).astype(np.uint8), d)
        return NBitsMatrix(8, (q + 128).astype(np.uint8), d, None, _f16(b[..., 2:4]))
    n = k // 256
    b = raw.reshape(out, n, _BLOCK_BYTES[kind])
    if kind == "Q5_K":
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        sc, mn = _k_scales(b[..., 4:16])
        qh, ql = b[..., 16:48], b[..., 48:].reshape(out, n, 4, 32)  # chunk j: low nibbles (sub-block 2j), then high
        high = np.stack([(qh >> np.uint8(2 * j + h)) & 1 for j in range(4) for h in range(2)], axis=2)
        q = np.stack([ql & 0x0F, ql >> 4], axis=3).reshape(out, n, 8, 32) | (high << 4)
        scales = (d[..., None] * sc).reshape(out, n * 8)
        return NBitsMatrix(8, (q + 128).astype(np.uint8).reshape(out, n * 8, BLOCK), scales, None,
                           (-(dmin[..., None] * mn)).reshape(out, n * 8).astype(np.float32))
    if kind == "Q6_K":
        ql, qh = b[..., 0:128].reshape(out, n, 2, 64), b[..., 128:192].reshape(out, n, 2, 32)
        sc, d = b[..., 192:208].view(np.int8).astype(np.float32), _f16(b[..., 208:210])
        lo = np.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3)  # [out, n, 2, 4, 32]
        hi = np.stack([(qh >> np.uint8(2 * t)) & 3 for t in range(4)], axis=3)
        q = (lo | (hi << 4)).reshape(out, n * 16, 16)
        return NBitsMatrix(8, (q + 96).astype(np.uint8), (d[..., None] * sc).reshape(out, n * 16))
    raise ValueError(f"eight_bit: {kind} blocks have no lossless 8-bit form")


def gguf_bits(weights: LlamaWeights, keys: list[str], parts: list[np.ndarray]) -> NBitsMatrix:
    """The matrices ``keys`` stacked by output, each in its own GGUF blocks as losslessly as
    ``MatMulNBits`` allows (``weights="gguf"``): 4 bits where every part is Q4_0, Q4_1 or Q4_K,
    else 8 bits (:func:`eight_bit`; a part without 5-, 6- or 8-bit blocks, F16 or F32, quantized
    to Q8_0)."""
    held = []
    for key, w in zip(keys, parts):
        found = weights.blocks.get(key)
        given = GgmlBlocks(*found) if found is not None else None
        if given is None:
            held.append(GgmlBlocks.quantize(w, "Q8_0").nbits())
        elif CARRIED_KINDS.get(given.kind) == 4:
            held.append(given.nbits())
        else:
            held.append(eight_bit(given))
    if any(h.bits == 8 for h in held):
        held = [h.widened() for h in held]
    return NBitsMatrix.concat(held)


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


def four_bit(weights: LlamaWeights, keys: list[str], parts: list[np.ndarray]) -> NBitsMatrix:
    """The matrices ``keys`` (float32 ``parts``, their values) stacked by output, in 4 bits: each
    part's own GGUF blocks where they are 4-bit (Q4_0, Q4_1, Q4_K: carried as they are), else
    its values requantized (:func:`requantize_4bit`)."""
    out = []
    for key, w in zip(keys, parts):
        found = weights.blocks.get(key)
        if found is not None and CARRIED_KINDS.get(found[0]) == 4:
            out.append(GgmlBlocks(*found).nbits())
        else:
            out.append(requantize_4bit(w))
    return NBitsMatrix.concat(out)


def int4_bits(weights: LlamaWeights, keys: list[str], parts: list[np.ndarray]) -> NBitsMatrix:
    """The matrices ``keys`` (float32 ``parts``, their values) stacked by output, every part
    requantized (:func:`requantize_4bit`), whatever blocks the GGUF holds it in (``weights="int4"``:
    4-bit blocks too, so no matrix has offsets)."""
    del weights, keys  # every part from its values alike
    return NBitsMatrix.concat([requantize_4bit(w) for w in parts])


def nbits_for(weight_dtype: str):
    """How the ``weight_dtype`` export holds a layer matrix: :func:`four_bit` (q4), :func:`int4_bits`
    (int4) or :func:`gguf_bits` (gguf)."""
    return {"q4": four_bit, "int4": int4_bits, "gguf": gguf_bits}[weight_dtype]


def requantization_error(
    weights: LlamaWeights, layers: int | None = None, weight_dtype: str = "q4",
) -> dict[str, tuple[bool, float, float, float]]:
    """Per layer matrix of ``weights`` (the first ``layers``): ``(carried, max abs error, RMS error,
    RMS of the weights)`` of the values ``weights=weight_dtype`` (q4 or int4) computes with against
    the float32 values (a GGUF's dequantized blocks). Under q4 carried blocks (Q4_0, Q4_1, Q4_K)
    differ only by float32 rounding and the rest are requantized (:func:`requantize_4bit`); under
    int4 every matrix is."""
    held = nbits_for(weight_dtype)
    report = {}
    for i, layer in enumerate(weights.layers[:layers]):
        for m in _MATS:
            key = f"layers.{i}.{m}"
            w = np.asarray(getattr(layer, m), dtype=np.float32)
            found = weights.blocks.get(key)
            err = held(weights, [key], [w]).dequantize().astype(np.float64) - w
            report[key] = (
                weight_dtype == "q4" and found is not None and CARRIED_KINDS.get(found[0]) == 4, float(np.abs(err).max()),
                float(np.sqrt(np.mean(err * err))), float(np.sqrt(np.mean(np.square(w, dtype=np.float64)))),
            )
    return report


Q4_HEAD_KIND = "Q8_0"
"""The ``weights="q4"`` and ``"gguf"`` exports: every layer matrix in 4 bits (:func:`four_bit`) or
its own blocks (:func:`gguf_bits`); the token embedding and the lm_head in Q8_0 blocks. ``"int4"``
keeps the embedding's Q8_0 table and requantizes the lm_head to 4 bits (:func:`output_bits`)."""
_MATS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def output_bits(weights: LlamaWeights, weight_dtype: str) -> NBitsMatrix | None:
    """The lm_head as its own ``MatMulNBits`` matrix: requantized to 4 bits with int4 weights (from
    the embedding's values when tied); the lm_head's Q8_0 blocks otherwise; None for a tied lm_head
    outside int4 (it multiplies by the embedding's Q8_0 table)."""
    if weight_dtype == "int4":
        return requantize_4bit(weights.output_matrix())
    if weights.lm_head is None:
        return None
    return blocks_for(weights, ["lm_head"], weights.lm_head, Q4_HEAD_KIND).nbits()


def q4_weights(weights: LlamaWeights, weight_dtype: str = "q4") -> LlamaWeights:
    """The float32 weights the ``weight_dtype="q4"`` (or ``"gguf"``, ``"int4"``) graph computes with
    (as :func:`int8_weights` for int8): each layer matrix its 4-bit values (:func:`four_bit`; with
    ``"gguf"``, its own blocks' values, :func:`gguf_bits`; with ``"int4"``, its values requantized,
    :func:`int4_bits`), the embedding and the lm_head their Q8_0 blocks' values (int4: the lm_head's
    4-bit values, untied); for a GGUF that stores them so, its own dequantized weights (up to
    float32 rounding of the offsets)."""
    held = nbits_for(weight_dtype)
    layers = [
        dataclasses.replace(layer, **{m: held(weights, [f"layers.{i}.{m}"], [getattr(layer, m)]).dequantize() for m in _MATS})
        for i, layer in enumerate(weights.layers)
    ]
    embd = blocks_for(weights, ["tok_embd"], weights.tok_embd, Q4_HEAD_KIND).dequantize()
    head = output_bits(weights, weight_dtype)
    return dataclasses.replace(weights, tok_embd=embd, layers=layers, lm_head=None if head is None else head.dequantize(), blocks={})
