"""The sampler's noise: the integer hash that gives each (row, token) its uniform ``u``.

The hash: every integer an exact ``int32`` below ``2**24``, on any backend. TensorRT's
integer division may round through float32 (NVIDIA/TensorRT#4702; export/OPS.md,
"Integer arithmetic"), so nothing the graph computes may need more than float32's 24
bits: every operand and result of its integer ``Add``/``Mul``/``Div``/``Sub`` stays in
``[0, 2**24)``, which ``sf_trt.export.int_bounds`` proves over the built graph from the
ranges it declares. Wide mixing runs where integers are exact everywhere, on the host:

* per row, on the host (:func:`noise_keys`): the 63-bit key and the 31-bit position
  go through two rounds of a 64-bit finalizer (``fmix64``, xor-shift-multiply) whose
  bits give three additive keys ``a_i`` in ``[0, 4096)`` and three odd multipliers
  ``m_i`` in ``[1025, 2047]`` (63 bits of key material per row);
* per token, at build time: a fixed bijection of ``[0, 2**24)`` (multiply, xor-shift)
  gives each token id a distinct state ``(A, B)``, two 12-bit halves, as ``[1, Vp]``
  constants;
* per (row, token), on ``[R, Vp]``: three Feistel rounds
  ``(A, B) -> (B, (A + F_i(B)) mod 4096)`` with ``F_i(B) = lo(p) + hi(p)``,
  ``p = (B + a_i) * m_i < 8192 * 2048 = 2**24`` (``lo``/``hi`` the product's low and
  high 12 bits): the fold is linear modulo 4095 and the state adds modulo 4096, two
  operations that do not mix linearly (IDEA's idea, in miniature); computed as
  ``t = A + p + p div 4096 <= 4095 + 16764930 + 4093 < 2**24`` and
  ``t mod 4096 = t - 4096 * (t div 4096)``. A Feistel round is a bijection whatever
  ``F`` is, so each row maps distinct tokens to distinct states;
* ``h = (B div 2) * 4096 + A`` in ``[0, 2**23)`` (the top bits come from the last
  round, so every key affects them), and ``u = (h + 0.5) * 2**-23 = (2h + 1) / 2**24``
  in float32: 24 significant bits, so ``u`` is exact and ``2**-24 <= u <= 1 - 2**-24``
  (with 24 hash bits ``(h + 0.5) / 2**24`` would need 25 bits and could round to 1.0,
  making ``g`` infinite).

The quality tests (tests/graphs/test_verify.py) hold it to the 0.999 chi-square quantile
for uniformity of ``u``, independence of adjacent positions, keys and tokens, uniform
argmax over a row's tokens, and sampled frequencies against the softmax.

The graph's part is written once, :func:`feistel` over abstract integer ops: it runs
on numpy (:class:`NumpyOps`, the reference :func:`hash_u`) and as ONNX nodes (the
verify graph's builder, :mod:`sf_trt.graphs.verify`).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ROUNDS", "LIMB", "MUL_RANGE", "U_BITS", "MAX_VOCAB",
    "noise_keys", "token_states", "feistel", "NumpyOps", "hash_u", "hash_bits",
]

ROUNDS = 3
"""Feistel rounds of the per-(row, token) hash."""
LIMB = 4096
"""The hash's state halves and additive keys are in ``[0, LIMB)``."""
MUL_RANGE = (1025, 2047)
"""The odd multiplicative keys: ``(4095 + 4095) * 2047 < 2**24``."""
U_BITS = 23
MAX_VOCAB = 2**24
"""Token states are a bijection of ``[0, 2**24)``: the padded vocabulary must fit."""


# -- the hash ----------------------------------------------------------------------------------
#
# The host part (noise_keys, token_states) is exact 64-bit integer code. The per-(row,
# token) part, feistel, is written once over abstract integer ops and runs on numpy
# (the reference, hash_u) and as ONNX nodes (the graph); hash_bits is a third, separate
# statement of the same function in Python ints, for the tests.

_M64 = 2**64 - 1
_FMIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
_KEY_SALT, _POS_MUL, _POS_SALT = 0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0x8CB92BA72F3D8DD7
_ADD_SHIFTS = tuple(12 * i for i in range(ROUNDS))  # bits 0..35 of the row's 64-bit hash
_MUL_SHIFTS = tuple(36 + 9 * i for i in range(ROUNDS))  # bits 36..62
_TOKEN_STEPS = ((0x9E3779, 0x5A5A5, 12), (0x85EBCB, 0x3C6EF, 11), (0xC2B2AF, 0x1B873, 12))
"""(odd multiplier, addend, xor-shift) per step of the token-state bijection of [0, 2**24)."""


_U64 = {name: np.uint64(v) for name, v in (
    ("33", 33), ("f0", _FMIX[0]), ("f1", _FMIX[1]), ("key", _KEY_SALT), ("pmul", _POS_MUL), ("psalt", _POS_SALT),
)}
_SHIFTS = np.array(_ADD_SHIFTS + _MUL_SHIFTS, np.uint64)
_MASK_LIST = (LIMB - 1,) * ROUNDS + (511,) * ROUNDS
_MASKS = np.array(_MASK_LIST, np.uint64)


def _fmix64(z: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, in place on a uint64 array (numpy wraps modulo 2**64)."""
    z ^= z >> _U64["33"]
    z *= _U64["f0"]
    z ^= z >> _U64["33"]
    z *= _U64["f1"]
    z ^= z >> _U64["33"]
    return z


def _fmix64_int(z: int) -> int:
    """:func:`_fmix64` of one value, in Python ints."""
    z ^= z >> 33
    z = (z * _FMIX[0]) & _M64
    z ^= z >> 33
    z = (z * _FMIX[1]) & _M64
    return z ^ (z >> 33)


def _row_hash(key: int, position: int) -> int:
    """The row's 64-bit hash, in Python ints (:func:`noise_keys` in numpy for many rows)."""
    return _fmix64_int(_fmix64_int((key + _KEY_SALT) & _M64) ^ ((position * _POS_MUL + _POS_SALT) & _M64))


_FEW_ROWS = 4
"""Up to this many rows, :func:`noise_keys` hashes in Python ints: cheaper than ~30 numpy calls."""


def noise_keys(rng_counter_base, position) -> tuple[np.ndarray, np.ndarray]:
    """The graph's ``(noise_add, noise_mul)``, int32 ``[R, ROUNDS]`` each, for rows with
    these ``rng_counter_base`` (``0 <= key < 2**63``) and ``position`` (``0 <= position < 2**31``):
    fields of ``fmix64(fmix64(key + c0) ^ (position * c1 + c2))``, bits 0..35 the additive
    keys, bits 36..62 the multipliers' 9-bit indices."""
    key = np.asarray(rng_counter_base, np.int64).reshape(-1)
    pos = np.asarray(position, np.int64).reshape(-1)
    if key.size <= _FEW_ROWS:
        rows = [_row_hash(k, p) for k, p in zip(key.tolist(), pos.tolist())]
        fields = np.array([[(z >> s) & m for s, m in zip(_ADD_SHIFTS + _MUL_SHIFTS, _MASK_LIST)] for z in rows], np.int32)
        fields = fields.reshape(-1, 2 * ROUNDS)
        return fields[:, :ROUNDS], fields[:, ROUNDS:] * 2 + MUL_RANGE[0]
    key, pos = key.astype(np.uint64), pos.astype(np.uint64)
    key += _U64["key"]
    pos *= _U64["pmul"]
    pos += _U64["psalt"]
    z = _fmix64(_fmix64(key) ^ pos)
    fields = ((z[:, None] >> _SHIFTS) & _MASKS).astype(np.int32)  # [R, 2 * ROUNDS]
    return fields[:, :ROUNDS], fields[:, ROUNDS:] * 2 + MUL_RANGE[0]


def token_states(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The per-token hash states ``(A, B)``, int32 ``[vocab]`` each in ``[0, 4096)``: a fixed
    bijection of ``[0, 2**24)`` applied to the token ids, split into 12-bit halves."""
    x = np.arange(vocab, dtype=np.int64)
    for mul, add, shift in _TOKEN_STEPS:
        x = (x * mul + add) & (MAX_VOCAB - 1)  # odd multiplier: a bijection modulo 2**24
        x = x ^ (x >> shift)  # a bijection too
    return (x >> 12).astype(np.int32), (x & (LIMB - 1)).astype(np.int32)


def _round(o, a, b, add, mul):
    """One Feistel round: ``(A, B) -> (B, (A + lo(p) + hi(p)) mod 4096)``, ``p = (B + add) * mul``.
    ``B, add < 4096``, ``mul <= 2047``: ``p <= 8190 * 2047 = 16764930``; ``t = A + p + hi(p) <= 16773118 < 2**24``."""
    p = o.mul(o.add(b, add), mul)
    t = o.add(a, o.add(p, o.div(p, LIMB)))  # == A + lo(p) + hi(p) modulo 4096
    return b, o.sub(t, o.mul(o.div(t, LIMB), LIMB))


def feistel(o, a, b, adds, muls):
    """The per-(row, token) hash: ``ROUNDS`` rounds, then ``h = (B div 2) * 4096 + A`` in ``[0, 2**23)``."""
    for add, mul in zip(adds, muls):
        a, b = _round(o, a, b, add, mul)
    return o.add(o.mul(o.div(b, 2), LIMB), a)


class NumpyOps:
    """int64 numpy arrays: every value is below 2**24, so nothing wraps."""

    def add(self, x, y):
        return np.add(x, y, dtype=np.int64)

    def sub(self, x, y):
        return np.subtract(x, y, dtype=np.int64)

    def mul(self, x, y):
        return np.multiply(x, y, dtype=np.int64)

    def div(self, x, d):
        return np.floor_divide(x, np.int64(d))  # operands >= 0: floor and truncation agree


def hash_u(rng_counter_base: np.ndarray, position: np.ndarray, vocab: int) -> np.ndarray:
    """The graph's ``u`` in numpy: float64 ``[R, vocab]``, each value exactly the float32 the
    graph computes."""
    adds, muls = noise_keys(rng_counter_base, position)
    a, b = (x.astype(np.int64).reshape(1, -1) for x in token_states(vocab))
    h = feistel(NumpyOps(), a, b, adds.astype(np.int64).T[..., None], muls.astype(np.int64).T[..., None])
    return (h.astype(np.float64) + 0.5) * 2.0**-U_BITS


def hash_bits(key: int, position: int, token: int) -> int:
    """The hash ``h`` of one (key, position, token), in Python ints, written independently of
    the numpy and ONNX forms of the token states and the rounds (tests compare the three)."""
    z = _row_hash(key, position)
    x = token
    for mul, add, shift in _TOKEN_STEPS:
        x = (x * mul + add) % MAX_VOCAB
        x ^= x >> shift
    a, b = divmod(x, LIMB)
    for i in range(ROUNDS):
        k, m = (z >> (12 * i)) % LIMB, MUL_RANGE[0] + 2 * ((z >> (36 + 9 * i)) % 512)
        lo, hi = divmod((b + k) * m, LIMB)[::-1]
        a, b = b, (a + lo + hi) % LIMB
    return (b // 2) * LIMB + a
