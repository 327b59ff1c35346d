"""A Llama-architecture GGUF file as a config and float32 weights.

:func:`load_gguf` reads the metadata and tensors with ``gguf.GGUFReader`` and
dequantizes every tensor to float32 with ``gguf.quants.dequantize``. It refuses
an architecture other than ``llama`` and a tensor type that ``gguf`` cannot
dequantize, naming what it found.

Layout of the weights (:class:`LlamaWeights`): matrices are ``[out, in]`` as
stored (PyTorch's ``nn.Linear`` layout). **Rotary layout**: llama.cpp's converter
permutes the rows of ``attn_q`` / ``attn_k`` within each head so that the two
halves HF's ``rotate_half`` pairs (dims ``i`` and ``i + head_dim/2``) become
adjacent (dims ``2i`` and ``2i + 1``). The weights here keep that GGUF order,
so the rotation they need is the *interleaved* one (GPT-J style: rotate each
adjacent pair ``(2i, 2i+1)`` by ``position * theta**(-2i/head_dim)``).
:func:`unpermute_rotary_rows` turns them back into HF's order, where
``rotate_half`` applies (tests check the two agree, and that the interleaved
convention is the one that gives the real model a low perplexity).
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
    """One decoder layer, float32, ``[out, in]`` matrices (q/k rows in GGUF rotary order)."""

    attn_norm: np.ndarray  # [hidden]
    wq: np.ndarray  # [n_heads * head_dim, hidden]
    wk: np.ndarray  # [n_kv_heads * head_dim, hidden]
    wv: np.ndarray  # [n_kv_heads * head_dim, hidden]
    wo: np.ndarray  # [hidden, n_heads * head_dim]
    ffn_norm: np.ndarray  # [hidden]
    w_gate: np.ndarray  # [ffn, hidden]
    w_up: np.ndarray  # [ffn, hidden]
    w_down: np.ndarray  # [hidden, ffn]


@dataclasses.dataclass
class LlamaWeights:
    """All weights of a Llama decoder, float32. ``lm_head`` is None when tied to ``tok_embd``."""

    tok_embd: np.ndarray  # [vocab, hidden]
    layers: list[LlamaLayerWeights]
    output_norm: np.ndarray  # [hidden]
    lm_head: np.ndarray | None = None  # [vocab, hidden]
    blocks: dict[str, tuple[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    """The GGUF's own bytes of the matrices it stores in a block type the 4-bit export carries
    (``Q4_1``, ``Q8_0``): ``{"tok_embd" | "lm_head" | "layers.<i>.<field>": (type name, raw uint8
    [out, bytes per row])}``; the float32 arrays above are their dequantization."""

    def output_matrix(self) -> np.ndarray:
        """The ``[vocab, hidden]`` matrix the logits are computed with."""
        return self.tok_embd if self.lm_head is None else self.lm_head

    def check(self, cfg: LlamaConfig) -> None:
        """Raise ValueError naming the first weight whose shape does not fit ``cfg``."""
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        expect = {"tok_embd": (cfg.vocab, cfg.hidden), "output_norm": (cfg.hidden,)}
        got = {"tok_embd": self.tok_embd.shape, "output_norm": self.output_norm.shape}
        if self.lm_head is not None:
            expect["lm_head"], got["lm_head"] = (cfg.vocab, cfg.hidden), self.lm_head.shape
        if len(self.layers) != cfg.n_layers:
            raise ValueError(f"LlamaWeights: {len(self.layers)} layers, config says {cfg.n_layers}")
        layer_shapes = {
            "attn_norm": (cfg.hidden,), "wq": (q, cfg.hidden), "wk": (kv, cfg.hidden), "wv": (kv, cfg.hidden),
            "wo": (cfg.hidden, q), "ffn_norm": (cfg.hidden,), "w_gate": (cfg.ffn, cfg.hidden),
            "w_up": (cfg.ffn, cfg.hidden), "w_down": (cfg.hidden, cfg.ffn),
        }
        for i, layer in enumerate(self.layers):
            for name, shape in layer_shapes.items():
                expect[f"layers[{i}].{name}"] = shape
                got[f"layers[{i}].{name}"] = getattr(layer, name).shape
        for name, shape in expect.items():
            if tuple(got[name]) != shape:
                raise ValueError(f"LlamaWeights: {name} has shape {tuple(got[name])}, expected {shape}")


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
    """Parse ``path``'s header, check it is a Llama GGUF whose metadata agrees
    with its tensor table and whose tensor data fits in the file; GGUFError
    naming what is wrong (a few seconds for a 49k vocabulary)."""
    reader = open_reader(path)
    check_tensors(reader, read_config(reader))


def _block_below(name: str, n_layers: int) -> bool:
    index = name.split(".")[1]
    return index.isdigit() and int(index) < n_layers


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a Llama GGUF of ``cfg`` holds, by name, with their numpy
    shapes (outermost dim first)."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if not cfg.tied_embeddings:
        shapes["output.weight"] = (cfg.vocab, cfg.hidden)
    per_layer = {
        "attn_norm": (cfg.hidden,), "attn_q": (q, cfg.hidden), "attn_k": (kv, cfg.hidden), "attn_v": (kv, cfg.hidden),
        "attn_output": (cfg.hidden, q), "ffn_norm": (cfg.hidden,), "ffn_gate": (cfg.ffn, cfg.hidden),
        "ffn_up": (cfg.ffn, cfg.hidden), "ffn_down": (cfg.hidden, cfg.ffn),
    }
    for i in range(cfg.n_layers):
        for g, shape in per_layer.items():
            shapes[f"blk.{i}.{g}.weight"] = shape
    return shapes


def check_tensors(reader, cfg: LlamaConfig) -> dict[str, Any]:
    """The tensors ``cfg`` needs, by name, after checking them against the
    tensor table and the file, before anything is allocated: the block count
    against the number of tensors, every shape against the metadata, every
    tensor's bytes inside the file. GGUFError names the first mismatch."""
    path = _path_of(reader)
    tensors = list(reader.tensors)
    needed = 2 + (0 if cfg.tied_embeddings else 1) + len(_LAYER_TENSORS) * cfg.n_layers
    if needed > len(tensors):
        raise GGUFError(
            f"{path}: llama.block_count {cfg.n_layers} needs {needed} tensors, the file holds {len(tensors)} (damaged or crafted metadata)"
        )
    size = int(reader.data.shape[0])
    by_name = {t.name: t for t in tensors}
    beyond = sorted(n for n in by_name if n.startswith("blk.") and not _block_below(n, cfg.n_layers))
    if beyond:
        raise GGUFError(f"{path}: tensor {beyond[0]!r} lies beyond llama.block_count {cfg.n_layers} (damaged or crafted metadata)")
    for name, shape in expected_shapes(cfg).items():
        t = by_name.get(name)
        if t is None:
            raise GGUFError(f"{path}: GGUF has no tensor {name!r} (expected a llama model)")
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
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"{_path_of(reader)}: architecture {arch!r} is not supported (expected 'llama')")
    n_heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    for key, value in (("llama.attention.head_count", n_heads), ("llama.embedding_length", hidden)):
        if value < 1:
            raise GGUFError(f"{_path_of(reader)}: {key} {value} is not a positive count")
    head_dim = int(_field(reader, "llama.attention.key_length", hidden // n_heads, required=False))
    rope_dim = int(_field(reader, "llama.rope.dimension_count", head_dim, required=False))
    if rope_dim != head_dim:
        raise GGUFError(f"{_path_of(reader)}: partial rotary embeddings (rope dims {rope_dim} of head dim {head_dim}) are not supported")
    if _field(reader, "llama.rope.scaling.type", "none", required=False) not in ("none", None):
        raise GGUFError(f"{_path_of(reader)}: rope scaling {_field(reader, 'llama.rope.scaling.type')!r} is not supported")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, "llama.vocab_size", len(tokens.data) if tokens is not None else 0, required=False))
    names = {t.name for t in reader.tensors}
    try:
        return LlamaConfig(
            n_layers=int(_field(reader, "llama.block_count")),
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", n_heads, required=False)),
            head_dim=head_dim,
            ffn=int(_field(reader, "llama.feed_forward_length")),
            vocab=vocab,
            rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0, required=False)),
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
            context_length=int(_field(reader, "llama.context_length")),
            tied_embeddings="output.weight" not in names,
            bos=int(_field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
            eos=int(_field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
        )
    except ValueError as exc:
        raise GGUFError(f"{_path_of(reader)}: {exc}") from exc


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


_LAYER_TENSORS = {
    "attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
    "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down",
}


_BLOCK_TYPES = ("Q4_1", "Q8_0")


def _field_names(n_layers: int) -> dict[str, str]:
    """GGUF tensor name -> :attr:`LlamaWeights.blocks` key, for the matrices."""
    out = {"token_embd.weight": "tok_embd", "output.weight": "lm_head"}
    for i in range(n_layers):
        for field, g in _LAYER_TENSORS.items():
            if field.startswith("w"):
                out[f"blk.{i}.{g}.weight"] = f"layers.{i}.{field}"
    return out


def _raw_blocks(tensor) -> np.ndarray:
    """A block-quantized matrix's bytes, uint8 ``[out, bytes per row]``, as stored (a copy: the reader maps the file)."""
    data = np.asarray(tensor.data)
    return np.ascontiguousarray(data.reshape(int(tensor.shape[-1]), -1) if data.ndim != 2 else data, dtype=np.uint8)


def load_gguf(
    path: Any, progress: bool | Callable[[Iterable], Iterable] = False
) -> tuple[LlamaConfig, LlamaWeights]:
    """Config and float32 weights of the Llama GGUF at ``path`` (or an open ``GGUFReader``).

    ``progress``: True for a tqdm bar over the tensors (or a wrapper of your own).
    Raises :class:`GGUFError` for a missing, truncated or foreign file, an
    architecture other than llama, a missing tensor, or a tensor type gguf
    cannot dequantize.
    """
    reader = path if hasattr(path, "tensors") else open_reader(path)
    cfg = read_config(reader)
    by_name = check_tensors(reader, cfg)  # before anything is allocated
    wanted = list(expected_shapes(cfg))
    names: Iterable[str] = wanted
    if progress is True:
        from tqdm import tqdm

        names = tqdm(wanted, desc="dequantize", unit="tensor")
    elif callable(progress):
        names = progress(wanted)
    try:
        arrays = {name: _dequantize(reader, by_name[name]) for name in names}
        raw = {name: (by_name[name].tensor_type.name, _raw_blocks(by_name[name])) for name in wanted if by_name[name].tensor_type.name in _BLOCK_TYPES}
    finally:
        if hasattr(names, "close"):
            names.close()  # a bar left open prints itself after the error message
    field_of = _field_names(cfg.n_layers)
    layers = [
        LlamaLayerWeights(**{field: arrays[f"blk.{i}.{g}.weight"] for field, g in _LAYER_TENSORS.items()})
        for i in range(cfg.n_layers)
    ]
    weights = LlamaWeights(
        tok_embd=arrays["token_embd.weight"],
        layers=layers,
        output_norm=arrays["output_norm.weight"],
        lm_head=None if cfg.tied_embeddings else arrays["output.weight"],
        blocks={field_of[name]: value for name, value in raw.items() if name in field_of},
    )
    try:
        weights.check(cfg)
    except ValueError as exc:
        raise GGUFError(f"{_path_of(reader)}: {exc}") from exc
    return cfg, weights


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
    if model != "gpt2":
        raise TokenizerError(f"tokenizer.ggml.model {model!r} is not supported (expected 'gpt2', byte-level BPE)")
    chat_template = _field(reader, "tokenizer.chat_template", None, required=False)
    if chat_template is not None and not isinstance(chat_template, str):
        raise GGUFError(f"{_path_of(reader)}: tokenizer.chat_template is not a string")
    return Tokenizer.from_vocab(
        _field(reader, "tokenizer.ggml.tokens", None, required=False),
        _field(reader, "tokenizer.ggml.merges", None, required=False),
        token_types=_field(reader, "tokenizer.ggml.token_type", None, required=False),
        pre=_field(reader, "tokenizer.ggml.pre", "gpt2", required=False),
        bos=int(_field(reader, "tokenizer.ggml.bos_token_id", 1, required=False)),
        eos=int(_field(reader, "tokenizer.ggml.eos_token_id", 2, required=False)),
        chat_template=chat_template,
    )
