"""A GGUF file of a supported family (:mod:`.families`) as a config and float32 weights.

:func:`load_gguf` reads the metadata and tensors with ``gguf.GGUFReader`` and
dequantizes each tensor to float32 with ``gguf.quants.dequantize`` (all at once, or lazily,
one :class:`LazyArray` at a time as an export takes them). It refuses an architecture outside
the families, a tensor the family does not use, a missing one, and a tensor type that ``gguf``
cannot dequantize, naming what it found.

Layout of the weights (:class:`LlamaWeights`): matrices are ``[out, in]`` as
stored (PyTorch's ``nn.Linear`` layout). **Rotary layout**: llama.cpp's converter
permutes the rows of a llama's ``attn_q`` / ``attn_k`` within each head so that the two
halves HF's ``rotate_half`` pairs (dims ``i`` and ``i + head_dim/2``) become
adjacent (dims ``2i`` and ``2i + 1``). The weights here are in that order for every
family (the others' rows, in transformers' order in their GGUFs and checkpoints, are
permuted into it as they are read: :func:`layer_from_file`), so the rotation they need is
the *interleaved* one (GPT-J style: rotate each adjacent pair ``(2i, 2i+1)`` by
``position * theta**(-2i/head_dim)``). :func:`unpermute_rotary_rows` turns them back into
HF's order, where ``rotate_half`` applies (tests check the two agree, and that the
interleaved convention is the one that gives the real model a low perplexity).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterable

import numpy as np

from sf_trt.formats.model_dir import LlamaConfig
from sf_trt.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "GGUFError", "LlamaLayerWeights", "LlamaWeights", "load_gguf", "open_reader", "read_config", "read_tokenizer",
    "check_gguf_file", "check_tensors", "expected_shapes", "model_name", "unpermute_rotary_rows",
]


class GGUFError(ValueError):
    """A GGUF file this loader cannot use; the message names the file and what was wrong."""


@dataclasses.dataclass
class LlamaLayerWeights:
    """One decoder layer, float32, ``[out, in]`` matrices (q/k rows, their biases and q/k norms in the
    interleaved rotary order, module docstring). The optional fields are a family's differences
    (:mod:`sf_trt.export.families`); None where the model has none."""

    attn_norm: np.ndarray  # [hidden]
    wq: np.ndarray  # [n_heads * head_dim, hidden]
    wk: np.ndarray  # [n_kv_heads * head_dim, hidden]
    wv: np.ndarray  # [n_kv_heads * head_dim, hidden]
    wo: np.ndarray  # [hidden, n_heads * head_dim]
    ffn_norm: np.ndarray  # [hidden]
    w_gate: np.ndarray  # [ffn, hidden]
    w_up: np.ndarray  # [ffn, hidden]
    w_down: np.ndarray  # [hidden, ffn]
    bq: np.ndarray | None = None  # [n_heads * head_dim]
    bk: np.ndarray | None = None  # [n_kv_heads * head_dim]
    bv: np.ndarray | None = None  # [n_kv_heads * head_dim]
    bo: np.ndarray | None = None  # [hidden]
    b_gate: np.ndarray | None = None  # [ffn]
    b_up: np.ndarray | None = None  # [ffn]
    b_down: np.ndarray | None = None  # [hidden]
    q_norm: np.ndarray | None = None  # [head_dim], shared by the q heads
    k_norm: np.ndarray | None = None  # [head_dim], shared by the k heads
    post_attn_norm: np.ndarray | None = None  # [hidden]
    post_ffn_norm: np.ndarray | None = None  # [hidden]

    def present(self) -> tuple[str, ...]:
        """The fields this layer holds."""
        return tuple(f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)


class LazyArray:
    """A float32 array of a known ``shape`` read only when it is used (``np.asarray``), and again
    on each use: an export holds one tensor at a time, not the model."""

    def __init__(self, shape: tuple[int, ...], load: Callable[[], np.ndarray]) -> None:
        self.shape, self._load = tuple(shape), load

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self._load()
        if tuple(values.shape) != self.shape:
            raise GGUFError(f"a tensor read as {tuple(values.shape)}, its table says {self.shape}")
        return values if dtype is None else values.astype(dtype, copy=False)


def layer_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The numpy shape of every per-layer field of ``cfg`` (:class:`LlamaLayerWeights`)."""
    q, kv, h, f, hd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden, cfg.ffn, cfg.head_dim
    return {
        "attn_norm": (h,), "wq": (q, h), "wk": (kv, h), "wv": (kv, h), "wo": (h, q), "ffn_norm": (h,), "w_gate": (f, h),
        "w_up": (f, h), "w_down": (h, f), "bq": (q,), "bk": (kv,), "bv": (kv,), "bo": (h,), "b_gate": (f,), "b_up": (f,),
        "b_down": (h,), "q_norm": (hd,), "k_norm": (hd,), "post_attn_norm": (h,), "post_ffn_norm": (h,),
        "w_qkv": (q + 2 * kv, h), "w_gate_up": (2 * f, h),
    }


@dataclasses.dataclass
class LlamaWeights:
    """All weights of a decoder, float32. ``lm_head`` is None when tied to ``tok_embd``."""

    tok_embd: np.ndarray  # [vocab, hidden]
    layers: list[LlamaLayerWeights]
    output_norm: np.ndarray  # [hidden]
    lm_head: np.ndarray | None = None  # [vocab, hidden]
    blocks: dict[str, tuple[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    """The GGUF's own bytes of the matrices it stores in a block type the 4-bit export carries
    (Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0): ``{"tok_embd" | "lm_head" | "layers.<i>.<field>": (type name, raw uint8
    [out, bytes per row])}``; the float32 arrays above are their dequantization."""
    rope_factors: np.ndarray | None = None
    """``[head_dim / 2]`` divisors of the rotary frequencies of the layers that use the global table
    (Llama 3's ``rope_freqs.weight``, or a linear scaling's factor); None: all 1."""

    def output_matrix(self) -> np.ndarray:
        """The ``[vocab, hidden]`` matrix the logits are computed with."""
        return self.tok_embd if self.lm_head is None else self.lm_head

    def check(self, cfg: LlamaConfig) -> None:
        """Raise ValueError naming the first weight whose shape does not fit ``cfg``, a field
        ``cfg``'s family needs that a layer lacks, or one it does not use that a layer holds."""
        from .families import family

        fam = family(cfg.arch)
        expect = {"tok_embd": (cfg.vocab, cfg.hidden), "output_norm": (cfg.hidden,)}
        got = {"tok_embd": self.tok_embd.shape, "output_norm": self.output_norm.shape}
        if self.lm_head is not None:
            expect["lm_head"], got["lm_head"] = (cfg.vocab, cfg.hidden), self.lm_head.shape
        if self.rope_factors is not None:
            expect["rope_factors"], got["rope_factors"] = (cfg.head_dim // 2,), self.rope_factors.shape
        if len(self.layers) != cfg.n_layers:
            raise ValueError(f"LlamaWeights: {len(self.layers)} layers, config says {cfg.n_layers}")
        shapes, allowed = layer_shapes(cfg), set(fam.layer_fields)
        for i, layer in enumerate(self.layers):
            present = layer.present()
            for name in fam.required:
                if name not in present:
                    raise ValueError(f"LlamaWeights: layers[{i}] has no {name} ({cfg.arch} needs one)")
            for name in present:
                if name not in allowed:
                    raise ValueError(f"LlamaWeights: layers[{i}].{name} is not used by {cfg.arch}")
                expect[f"layers[{i}].{name}"] = shapes[name]
                got[f"layers[{i}].{name}"] = getattr(layer, name).shape
        for name, shape in expect.items():
            if tuple(got[name]) != shape:
                raise ValueError(f"LlamaWeights: {name} has shape {tuple(got[name])}, expected {shape}")


def permute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF (half-split) q/k rows -> GGUF (interleaved-pair) order, per head: the inverse of
    :func:`unpermute_rotary_rows` (llama.cpp's converter permutation)."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


ROTARY_FIELDS = {"wq": "n_heads", "bq": "n_heads", "wk": "n_kv_heads", "bk": "n_kv_heads", "q_norm": None, "k_norm": None}
"""The fields whose rows follow the rotary pairs, and the config count of their heads (None: one head)."""


def layer_from_file(cfg: LlamaConfig, fam, tensors: dict[str, Any], *, order: str, norm_offset: float = 0.0) -> dict[str, Any]:
    """A layer's fields from what a file holds (``{field: array}``, fused matrices as stored):
    fused matrices split into their parts, the rotary rows put in the interleaved order (when
    the file's ``order`` is ``"half"``) and ``norm_offset`` added to every norm weight. Works on
    float32 arrays and on raw block rows alike (``norm_offset`` 0 for those)."""
    from .families import NORM_FIELDS

    out = dict(tensors)
    q, kv, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn
    if "w_qkv" in out:
        qkv = out.pop("w_qkv")
        out["wq"], out["wk"], out["wv"] = qkv[:q], qkv[q:q + kv], qkv[q + kv:]
    if "w_gate_up" in out:
        gu = out.pop("w_gate_up")
        out["w_gate"], out["w_up"] = gu[:f], gu[f:]
    if order == "half":
        for name, heads in ROTARY_FIELDS.items():
            if name in out:
                out[name] = np.ascontiguousarray(permute_rotary_rows(out[name], 1 if heads is None else getattr(cfg, heads)))
    if norm_offset:
        for name in NORM_FIELDS:
            if name in out:
                out[name] = (out[name] + np.float32(norm_offset)).astype(np.float32)
    return out


def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """GGUF (interleaved-pair) q/k rows -> HF (half-split) order, per head.

    Inverse of llama.cpp's converter permutation: GGUF row ``2i + h`` of a head
    is HF row ``h * head_dim/2 + i``.
    """
    rows = w.shape[0]
    head_dim = rows // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- reading ---------------------------------------------------------------------


def open_reader(path: str | os.PathLike):
    """``gguf.GGUFReader`` over ``path``; GGUFError when it is missing or unreadable."""
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: no such file (expected a GGUF model file)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path}: not a GGUF file (expected magic b'GGUF', found {magic!r})")
    try:
        return gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError/IndexError/... on a cut file
        raise GGUFError(f"{path}: GGUF file is truncated or corrupt ({type(exc).__name__}: {exc})") from exc


def check_gguf_file(path: str | os.PathLike) -> None:
    """Parse ``path``'s header, check it is a GGUF of a supported family whose metadata agrees
    with its tensor table and whose tensor data fits in the file; GGUFError
    naming what is wrong (a few seconds for a 49k vocabulary)."""
    reader = open_reader(path)
    check_tensors(reader, read_config(reader))


def _block_below(name: str, n_layers: int) -> bool:
    index = name.split(".")[1]
    return index.isdigit() and int(index) < n_layers


ROPE_FREQS = "rope_freqs.weight"
"""Llama 3's per-frequency rope divisors, as llama.cpp's converter writes them."""


def expected_shapes(cfg: LlamaConfig, present: Iterable[str] = ()) -> dict[str, tuple[int, ...]]:
    """The tensors a GGUF of ``cfg`` holds, by name, with their numpy shapes (outermost dim
    first): every tensor its family requires, and those of the optional ones (biases, Llama 3's
    ``rope_freqs.weight``) that are in ``present``."""
    from .families import GGUF_LAYER_NAMES, family

    fam, present = family(cfg.arch), set(present)
    shapes = {"token_embd.weight": (cfg.vocab, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (cfg.vocab, cfg.hidden)
    if fam.rope_factors and ROPE_FREQS in present:
        shapes[ROPE_FREQS] = (cfg.head_dim // 2,)
    layer = layer_shapes(cfg)
    for i in range(cfg.n_layers):
        for field, required in fam.file_fields():
            name = f"blk.{i}.{GGUF_LAYER_NAMES[field]}"
            if required or name in present:
                shapes[name] = layer[field]
    return shapes


def check_tensors(reader, cfg: LlamaConfig) -> dict[str, Any]:
    """The tensors ``cfg`` needs, by name, after checking them against the
    tensor table and the file, before anything is allocated: the block count
    against the number of tensors, every shape against the metadata, every
    tensor's bytes inside the file, and that the file holds no tensor the model
    does not use (a tensor is never silently ignored). GGUFError names the first mismatch."""
    path = _path_of(reader)
    tensors = list(reader.tensors)
    from .families import family

    by_name = {t.name: t for t in tensors}
    needed = 2 + (0 if cfg.tied_embeddings else 1) + sum(r for _, r in family(cfg.arch).file_fields()) * cfg.n_layers
    blocks = {n.split(".")[1] for n in by_name if n.startswith("blk.")}
    if needed > len(tensors) and cfg.n_layers > len(blocks):  # counted before names are listed: a crafted count lists nothing
        raise GGUFError(
            f"{path}: {cfg.arch}.block_count {cfg.n_layers} needs {needed} tensors, the file holds {len(tensors)} (damaged or crafted metadata)"
        )
    expected = expected_shapes(cfg, by_name)
    size = int(reader.data.shape[0])
    beyond = sorted(n for n in by_name if n.startswith("blk.") and not _block_below(n, cfg.n_layers))
    if beyond:
        raise GGUFError(f"{path}: tensor {beyond[0]!r} lies beyond {cfg.arch}.block_count {cfg.n_layers} (damaged or crafted metadata)")
    unused = [n for n in by_name if n not in expected]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise GGUFError(f"{path}: tensor {unused[0]!r}{more} is not used by sf_trt's {cfg.arch} decoder; refusing to ignore it")
    for name, shape in expected.items():
        t = by_name.get(name)
        if t is None:
            raise GGUFError(f"{path}: GGUF has no tensor {name!r} (expected a {cfg.arch} model)")
        got = tuple(int(d) for d in reversed(t.shape.tolist()))
        if got != shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {got}, the metadata implies {shape}")
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size or int(t.n_bytes) > t.data.nbytes:
            raise GGUFError(f"{path}: truncated GGUF (tensor {name!r} runs to byte {end}, the file has {size})")
    return by_name


def _path_of(reader) -> str:
    return str(getattr(reader.data, "filename", None) or "<gguf>")


def _field(reader, key: str, default: Any = None, *, required: bool = True) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise GGUFError(f"{_path_of(reader)}: GGUF metadata has no {key!r}")
        return default
    try:
        return field.contents()
    except (TypeError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise GGUFError(f"{_path_of(reader)}: GGUF metadata {key!r} is malformed ({type(exc).__name__}: {exc})") from None


def read_config(reader) -> LlamaConfig:
    """The :class:`LlamaConfig` of an open GGUF reader; refuses a non-llama
    architecture and metadata of the wrong type, naming the key."""
    try:
        return _read_config(reader)
    except (TypeError, ValueError, ArithmeticError, IndexError) as exc:
        if isinstance(exc, GGUFError):
            raise
        raise GGUFError(f"{_path_of(reader)}: GGUF metadata is malformed ({type(exc).__name__}: {exc})") from None


def _read_config(reader) -> LlamaConfig:
    from .families import FAMILIES

    path = _path_of(reader)
    arch = _field(reader, "general.architecture")
    fam = FAMILIES.get(arch) if isinstance(arch, str) else None
    if fam is None:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(FAMILIES)})")

    def key(name: str, default: Any = None, required: bool = True) -> Any:
        return _field(reader, f"{arch}.{name}", default, required=required)

    n_heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    for name, value in (("attention.head_count", n_heads), ("embedding_length", hidden)):
        if value < 1:
            raise GGUFError(f"{path}: {arch}.{name} {value} is not a positive count")
    head_dim = int(key("attention.key_length", hidden // n_heads, required=False))
    value_dim = int(key("attention.value_length", head_dim, required=False))
    if value_dim != head_dim:
        raise GGUFError(f"{path}: value heads of {value_dim} dims beside key heads of {head_dim} are not supported")
    rope_dim = int(key("rope.dimension_count", head_dim, required=False))
    if rope_dim != head_dim:
        raise GGUFError(f"{path}: partial rotary embeddings (rope dims {rope_dim} of head dim {head_dim}) are not supported")
    scaling = key("rope.scaling.type", "none", required=False)
    if scaling not in ("none", "linear", None):
        raise GGUFError(f"{path}: rope scaling {scaling!r} is not supported (supported: none, linear, llama3's rope_freqs.weight)")
    for soft in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key(soft, 0.0, required=False):
            raise GGUFError(f"{path}: {arch}.{soft} is not supported")
    n_layers = int(key("block_count"))
    window = int(key("attention.sliding_window", 0, required=False) or 0)
    if window and fam.sliding == "none":
        raise GGUFError(f"{path}: {arch}.attention.sliding_window {window}: a sliding window is not supported for {arch}")
    pattern = key("attention.sliding_window_pattern", None, required=False)
    if isinstance(pattern, list) and window:
        sliding = tuple(i for i, flag in enumerate(pattern) if flag)
    else:
        if isinstance(pattern, int) and pattern > 0:
            fam = dataclasses.replace(fam, sliding_pattern=pattern)
        sliding = fam.sliding_layers(n_layers, window)
    local_theta = float(key("rope.freq_base_swa", fam.default_local_theta, required=False)) if sliding else 0.0
    query_scale = 0.0
    if arch == "gemma3" and n_layers == 62:  # Gemma 3 27B: query_pre_attn_scalar = hidden / heads (as llama.cpp)
        query_scale = float((hidden / n_heads) ** -0.5)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(key("vocab_size", len(tokens.data) if tokens is not None else 0, required=False))
    names = {t.name for t in reader.tensors}
    try:
        return LlamaConfig(
            n_layers=n_layers,
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(key("attention.head_count_kv", n_heads, required=False)),
            head_dim=head_dim,
            ffn=int(key("feed_forward_length")),
            vocab=vocab,
            rope_theta=float(key("rope.freq_base", 10000.0, required=False)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            context_length=int(key("context_length")),
            tied_embeddings="output.weight" not in names,
            bos=int(_field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
            eos=int(_field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
            arch=arch,
            sliding_window=window if sliding else 0,
            sliding_layers=sliding,
            rope_local_theta=local_theta,
            query_scale=query_scale,
        )
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from exc


def _dequantize(reader, tensor) -> np.ndarray:
    import gguf

    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
    try:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(shape)
    except NotImplementedError as exc:
        raise GGUFError(
            f"{_path_of(reader)}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, which gguf "
            f"{getattr(gguf, '__version__', '')} cannot dequantize ({exc})"
        ) from exc
    except (ValueError, TypeError, AttributeError) as exc:
        raise GGUFError(f"{_path_of(reader)}: tensor {tensor.name!r} cannot be read as {shape} ({type(exc).__name__}: {exc})") from None
    bad = values.size - int(np.count_nonzero(np.isfinite(values)))
    if bad:
        raise GGUFError(f"{_path_of(reader)}: tensor {tensor.name!r} holds {bad} non-finite values (NaN or inf); the file is damaged")
    return values


_BLOCK_TYPES = ("Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0")
"""The block types whose bytes :attr:`LlamaWeights.blocks` keeps (those ``weights="q4"`` or ``"gguf"`` carries as they are)."""


def _raw_blocks(tensor) -> np.ndarray:
    """A block-quantized matrix's bytes, uint8 ``[out, bytes per row]``, as stored (a copy: the reader maps the file)."""
    data = np.asarray(tensor.data)
    return np.ascontiguousarray(data.reshape(int(tensor.shape[-1]), -1) if data.ndim != 2 else data, dtype=np.uint8)


def load_gguf(
    path: Any, progress: bool | Callable[[Iterable], Iterable] = False, *, lazy: bool = False,
) -> tuple[LlamaConfig, LlamaWeights]:
    """Config and float32 weights of the GGUF at ``path`` (or an open ``GGUFReader``).

    ``progress``: True for a tqdm bar over the tensors (or a wrapper of your own).
    ``lazy``: every tensor a :class:`LazyArray`, dequantized when it is used (after the same
    checks of the tensor table).
    Raises :class:`GGUFError` for a missing, truncated or foreign file, an
    architecture sf_trt does not support, a missing tensor, a tensor the model
    would not use, or a tensor type gguf cannot dequantize.
    """
    reader = path if hasattr(path, "tensors") else open_reader(path)
    cfg = read_config(reader)
    by_name = check_tensors(reader, cfg)  # before anything is allocated
    weights = _lazy_weights(reader, cfg, by_name)
    return cfg, (weights if lazy else materialized(weights, progress))


def materialized(weights: LlamaWeights, progress: bool | Callable[[Iterable], Iterable] = False) -> LlamaWeights:
    """``weights`` with every :class:`LazyArray` read into a float32 array (``progress`` as for
    :func:`load_gguf`)."""
    items = [(None, "tok_embd"), (None, "lm_head")] + [(layer, f) for layer in weights.layers for f in layer.present()]
    steps: Iterable = items
    if progress is True:
        from tqdm import tqdm

        steps = tqdm(items, desc="dequantize", unit="tensor")
    elif callable(progress):
        steps = progress(items)
    top = {}
    try:
        for layer, f in steps:
            value = getattr(weights if layer is None else layer, f)
            if isinstance(value, LazyArray):
                value = np.asarray(value)
            if layer is None:
                top[f] = value
            else:
                setattr(layer, f, value)
    finally:
        if hasattr(steps, "close"):
            steps.close()  # a bar left open prints itself after the error message
    return dataclasses.replace(weights, **top)


def _lazy_weights(reader, cfg: LlamaConfig, by_name: dict[str, Any]) -> LlamaWeights:
    """:func:`load_gguf`'s weights as :class:`LazyArray` s (the small ones, and the raw blocks
    ``weights="q4"`` carries, read now)."""
    from .families import GGUF_LAYER_NAMES, family

    fam = family(cfg.arch)
    shapes = layer_shapes(cfg)

    def field(i: int, f: str) -> LazyArray:
        src = fam.source_of(f)
        tensor = by_name[f"blk.{i}.{GGUF_LAYER_NAMES[src]}"]
        return LazyArray(shapes[f], lambda: layer_from_file(cfg, fam, {src: _dequantize(reader, tensor)}, order=fam.gguf_rope)[f])

    def whole(name: str) -> LazyArray:
        return LazyArray(tuple(int(d) for d in reversed(by_name[name].shape.tolist())), lambda: _dequantize(reader, by_name[name]))

    layers = []
    for i in range(cfg.n_layers):
        held = [f for f in fam.layer_fields if f"blk.{i}.{GGUF_LAYER_NAMES[fam.source_of(f)]}" in by_name]
        layers.append(LlamaLayerWeights(**{f: field(i, f) for f in held}))
    blocks = {}
    for i in range(cfg.n_layers):
        for f in fam.layer_fields:
            src = fam.source_of(f)
            tensor = by_name.get(f"blk.{i}.{GGUF_LAYER_NAMES[src]}")
            if tensor is not None and f.startswith("w") and tensor.tensor_type.name in _BLOCK_TYPES:
                rows = layer_from_file(cfg, fam, {src: _raw_blocks(tensor)}, order=fam.gguf_rope)[f]
                blocks[f"layers.{i}.{f}"] = (tensor.tensor_type.name, rows)
    for name, key in (("token_embd.weight", "tok_embd"), ("output.weight", "lm_head")):
        if name in by_name and by_name[name].tensor_type.name in _BLOCK_TYPES:
            blocks[key] = (by_name[name].tensor_type.name, _raw_blocks(by_name[name]))
    weights = LlamaWeights(
        tok_embd=whole("token_embd.weight"), layers=layers, output_norm=_dequantize(reader, by_name["output_norm.weight"]),
        lm_head=None if cfg.tied_embeddings else whole("output.weight"), blocks=blocks, rope_factors=_rope_factors(reader, cfg, by_name),
    )
    try:
        weights.check(cfg)
    except ValueError as exc:
        raise GGUFError(f"{_path_of(reader)}: {exc}") from exc
    return weights


def _rope_factors(reader, cfg: LlamaConfig, by_name: dict[str, Any]) -> np.ndarray | None:
    """Llama 3's ``rope_freqs.weight``, times a linear scaling's factor when the file sets one."""
    factors = _dequantize(reader, by_name[ROPE_FREQS]) if ROPE_FREQS in by_name else None
    if _field(reader, f"{cfg.arch}.rope.scaling.type", "none", required=False) == "linear":
        factor = float(_field(reader, f"{cfg.arch}.rope.scaling.factor", 1.0, required=False))
        factors = (np.ones(cfg.head_dim // 2, np.float32) if factors is None else factors) * np.float32(factor)
    return factors


def model_name(reader) -> str | None:
    """``general.name`` of an open GGUF reader, if it is a string."""
    name = _field(reader, "general.name", None, required=False)
    return name if isinstance(name, str) else None


def read_tokenizer(reader) -> Tokenizer:
    """The model's tokenizer from an open GGUF reader's ``tokenizer.ggml.*`` metadata.

    Refuses a tokenizer model other than ``gpt2`` (byte-level BPE), naming it.
    """
    try:
        return _read_tokenizer(reader)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, (GGUFError, TokenizerError)):
            raise
        raise GGUFError(f"{_path_of(reader)}: GGUF tokenizer metadata is malformed ({type(exc).__name__}: {exc})") from None


def _read_tokenizer(reader) -> Tokenizer:
    model = _field(reader, "tokenizer.ggml.model", None, required=False)
    if model not in ("gpt2", "llama"):
        raise TokenizerError(f"tokenizer.ggml.model {model!r} is not supported (expected 'gpt2', byte-level BPE, or 'llama', sentencepiece)")
    chat_template = _field(reader, "tokenizer.chat_template", None, required=False)
    if chat_template is not None and not isinstance(chat_template, str):
        raise GGUFError(f"{_path_of(reader)}: tokenizer.chat_template is not a string")
    if model == "llama":
        unk = _field(reader, "tokenizer.ggml.unknown_token_id", None, required=False)
        return Tokenizer.from_sentencepiece(
            _field(reader, "tokenizer.ggml.tokens", None, required=False),
            _field(reader, "tokenizer.ggml.scores", None, required=False),
            token_types=_field(reader, "tokenizer.ggml.token_type", None, required=False),
            add_space_prefix=bool(_field(reader, "tokenizer.ggml.add_space_prefix", True, required=False)),
            unk=None if unk is None else int(unk),
            bos=int(_field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
            eos=int(_field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
            chat_template=chat_template,
        )
    return Tokenizer.from_vocab(
        _field(reader, "tokenizer.ggml.tokens", None, required=False),
        _field(reader, "tokenizer.ggml.merges", None, required=False),
        token_types=_field(reader, "tokenizer.ggml.token_type", None, required=False),
        pre=_field(reader, "tokenizer.ggml.pre", "gpt2", required=False),
        bos=int(_field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
        eos=int(_field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
        chat_template=chat_template,
    )
