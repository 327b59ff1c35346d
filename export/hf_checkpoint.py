"""A Hugging Face checkpoint directory as a config and float32 weights, read with ``safetensors`` (no torch).

A directory holds ``config.json``, the weights as ``model.safetensors`` or sharded
(``model.safetensors.index.json`` and the files its ``weight_map`` names) in BF16, F16 or F32,
and the tokenizer: ``tokenizer.json``, with the chat template in ``tokenizer_config.json``
(``chat_template``) or ``chat_template.jinja``.

``config.json``'s ``model_type`` names the family (:mod:`.families`); both spellings of the rope
settings are read (``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` as transformers 4
writes them, ``rope_parameters`` as transformers 5 does, flat or by layer type). Rope scaling
``llama3`` and ``linear`` are computed (:func:`rope_factors`); any other is refused. As for a GGUF
(:func:`~.gguf_llama.check_tensors`), every tensor of the checkpoint is used or the directory is
refused naming it, and a tensor the family needs that is not there is refused naming it.

transformers keeps the q/k rows in the half-split order (``rotate_half``); they are permuted
here into the interleaved order the graph rotates (:func:`~.gguf_llama.layer_from_file`), and
Gemma's norm weights ``w`` become ``1 + w`` (:attr:`~.families.Family.hf_norm_offset`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from sf_trt.formats.model_dir import LlamaConfig

from .families import FAMILIES, Family
from .gguf_llama import LazyArray, LlamaLayerWeights, LlamaWeights, layer_from_file, layer_shapes, materialized

__all__ = [
    "HFError", "read_hf_config", "load_hf", "read_hf_tokenizer", "rope_factors", "hf_files", "is_hf_dir", "check_hf_tensors",
    "hf_tensor_table",
]

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
DTYPES = ("BF16", "F16", "F32")


class HFError(ValueError):
    """A checkpoint directory this loader cannot use; the message names the path and what was wrong."""


def is_hf_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a ``config.json`` (a checkpoint, not a model directory)."""
    p = Path(path)
    return p.is_dir() and (p / CONFIG).is_file()


def _model_type_family(model_type: Any) -> Family | None:
    return next((f for f in FAMILIES.values() if model_type in f.hf_model_types), None)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HFError(f"{path}: not readable JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise HFError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _rope_settings(conf: dict[str, Any], where: Path) -> tuple[float, float, dict[str, Any] | None]:
    """``(theta, local theta or 0, scaling or None)`` from either spelling (module docstring)."""
    params = conf.get("rope_parameters")
    if params is None:
        return float(conf.get("rope_theta", 10000.0)), float(conf.get("rope_local_base_freq") or 0.0), conf.get("rope_scaling")
    if not isinstance(params, dict):
        raise HFError(f"{where}: rope_parameters is not an object")
    local = 0.0
    if "full_attention" in params:
        sliding = params.get("sliding_attention") or {}
        if (sliding.get("rope_type") or "default") != "default":
            raise HFError(f"{where}: rope scaling {sliding.get('rope_type')!r} on the sliding layers is not supported")
        local = float(sliding.get("rope_theta") or 0.0)
        params = params["full_attention"]
    return float(params.get("rope_theta", 10000.0)), local, params


def rope_factors(scaling: dict[str, Any] | None, cfg: LlamaConfig, where: str = "config.json") -> np.ndarray | None:
    """The ``[head_dim / 2]`` divisors of the rotary frequencies a rope scaling asks for (None:
    none): ``linear`` divides each by its factor; ``llama3`` (Llama 3.1+) divides the low
    frequencies by ``factor``, keeps the high ones, and blends in between, as transformers'
    ``_compute_llama3_parameters`` does. Any other type is refused."""
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    half = cfg.head_dim // 2
    if kind == "default":
        return None
    if kind == "linear":
        return np.full(half, float(scaling["factor"]), np.float32)
    if kind != "llama3":
        raise HFError(f"{where}: rope scaling {kind!r} is not supported (supported: default, linear, llama3)")
    try:
        factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
    except (KeyError, TypeError, ValueError) as exc:
        raise HFError(f"{where}: llama3 rope scaling without a usable {exc}") from None
    inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim)
    wavelen = 2.0 * math.pi / inv_freq
    scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    scaled = np.where(medium, (1.0 - smooth) * scaled / factor + smooth * scaled, scaled)
    return (inv_freq / scaled).astype(np.float32)


def read_hf_config(path: str | os.PathLike) -> tuple[LlamaConfig, dict[str, Any] | None]:
    """``(config, rope scaling)`` of the checkpoint directory ``path``; refuses a model type
    sf_trt does not support and settings its graph would not compute, naming the key."""
    d = Path(path)
    where = d / CONFIG
    if not where.is_file():
        raise HFError(f"{d}: no {CONFIG} (expected a Hugging Face checkpoint directory)")
    conf = _json(where)
    if isinstance(conf.get("text_config"), dict) and _model_type_family(conf.get("model_type")) is None:
        raise HFError(f"{where}: model_type {conf.get('model_type')!r} is a multimodal model; sf_trt reads text-only checkpoints")
    fam = _model_type_family(conf.get("model_type"))
    if fam is None:
        known = ", ".join(t for f in FAMILIES.values() for t in f.hf_model_types)
        raise HFError(f"{where}: model_type {conf.get('model_type')!r} is not supported (supported: {known})")
    try:
        cfg, scaling = _config(conf, fam, where)
        rope_factors(scaling, cfg, str(where))  # an unsupported scaling is refused here, before any tensor is read
        return cfg, scaling
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, HFError):
            raise
        raise HFError(f"{where}: {type(exc).__name__}: {exc}") from None


def _token_id(value: Any) -> int:
    """A token id from config.json (a list: its first)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _config(conf: dict[str, Any], fam: Family, where: Path) -> tuple[LlamaConfig, dict[str, Any] | None]:
    act = conf.get("hidden_activation") or conf.get("hidden_act") or "silu"
    expected_act = {"silu": ("silu",), "gelu_tanh": ("gelu_pytorch_tanh", "gelu_tanh")}[fam.activation]
    if act not in expected_act:
        raise HFError(f"{where}: activation {act!r} is not supported for {fam.name} (expected {expected_act[0]!r})")
    for key in ("attn_logit_softcapping", "final_logit_softcapping", "use_bidirectional_attention"):
        if conf.get(key):
            raise HFError(f"{where}: {key} {conf[key]} is not supported")
    theta, local_theta, scaling = _rope_settings(conf, where)
    partial = (scaling or {}).get("partial_rotary_factor", conf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise HFError(f"{where}: partial rotary embeddings (partial_rotary_factor {partial}) are not supported")
    n_layers, hidden, n_heads = int(conf["num_hidden_layers"]), int(conf["hidden_size"]), int(conf["num_attention_heads"])
    window = conf.get("sliding_window") or 0
    if conf.get("layer_types") is not None:
        types = conf["layer_types"]
        if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {"sliding_attention", "full_attention"}:
            raise HFError(f"{where}: layer_types is not one of 'sliding_attention' / 'full_attention' per layer")
        sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif fam.name in ("qwen2", "qwen3"):
        if conf.get("use_sliding_window"):
            raise HFError(f"{where}: use_sliding_window without layer_types is not supported")
        sliding = ()
    else:
        pattern = conf.get("sliding_window_pattern") or conf.get("_sliding_window_pattern") or fam.sliding_pattern
        sliding = (fam if not pattern else _with_pattern(fam, pattern)).sliding_layers(n_layers, window)
    if sliding and not window:
        raise HFError(f"{where}: layers slide but sliding_window is {conf.get('sliding_window')!r}")
    if window and fam.sliding == "none" and sliding:
        raise HFError(f"{where}: a sliding window is not supported for {fam.name}")
    scale = float(conf["query_pre_attn_scalar"]) ** -0.5 if conf.get("query_pre_attn_scalar") else 0.0
    cfg = LlamaConfig(
        n_layers=n_layers, hidden=hidden, n_heads=n_heads,
        n_kv_heads=int(conf.get("num_key_value_heads") or n_heads),
        head_dim=int(conf.get("head_dim") or hidden // n_heads),
        ffn=int(conf["intermediate_size"]), vocab=int(conf["vocab_size"]), rope_theta=theta,
        rms_eps=float(conf.get("rms_norm_eps", 1e-6)), context_length=int(conf.get("max_position_embeddings", 2048)),
        tied_embeddings=bool(conf.get("tie_word_embeddings", True)),
        bos=_token_id(conf.get("bos_token_id")), eos=_token_id(conf.get("eos_token_id")), arch=fam.name,
        sliding_window=int(window) if sliding else 0, sliding_layers=sliding,
        rope_local_theta=local_theta if sliding and local_theta else (fam.default_local_theta if sliding else 0.0),
        query_scale=scale,
    )
    return cfg, scaling


def _with_pattern(fam: Family, pattern: int) -> Family:
    import dataclasses

    return dataclasses.replace(fam, sliding_pattern=int(pattern))


def hf_files(path: str | os.PathLike) -> list[Path]:
    """The checkpoint's weight files: ``model.safetensors``, or the shards its index names."""
    d = Path(path)
    if (d / INDEX).is_file():
        index = _json(d / INDEX)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise HFError(f"{d / INDEX}: no weight_map of tensor names to files")
        files = sorted(set(weight_map.values()))
        for name in files:
            if Path(name).name != name or not (d / name).is_file():
                raise HFError(f"{d / INDEX}: shard {name!r} is not a file in {d}")
        return [d / n for n in files]
    if (d / SINGLE).is_file():
        return [d / SINGLE]
    found = sorted(p.name for p in d.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    hint = f" (found {', '.join(found[:3])}: PyTorch pickles are not read)" if found else ""
    raise HFError(f"{d}: no {SINGLE} or {INDEX} (expected safetensors weights){hint}")


class _Tensors:
    """Every tensor of the checkpoint's safetensors files: name -> (file, dtype, shape); read as float32."""

    def __init__(self, files: list[Path]) -> None:
        from safetensors import safe_open

        self.where: dict[str, tuple[Path, str, tuple[int, ...]]] = {}
        for f in files:
            try:
                with safe_open(str(f), framework="np") as st:
                    for name in st.keys():
                        sl = st.get_slice(name)
                        self.where[name] = (f, sl.get_dtype(), tuple(int(x) for x in sl.get_shape()))
            except Exception as exc:  # safetensors raises its own errors on a damaged header
                raise HFError(f"{f}: not a readable safetensors file ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 (BF16 widened bit for bit: numpy has no bfloat16)."""
        f, dtype, shape = self.where[name]
        if dtype == "BF16":
            begin, end = _offsets(f)[name]
            raw = np.fromfile(f, dtype="<u2", count=(end - begin) // 2, offset=begin)
            values = (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            from safetensors import safe_open

            with safe_open(str(f), framework="np") as st:
                values = st.get_tensor(name)
        values = np.ascontiguousarray(values, dtype=np.float32)
        bad = values.size - int(np.count_nonzero(np.isfinite(values)))
        if bad:
            raise HFError(f"{f}: tensor {name!r} holds {bad} non-finite values (NaN or inf); the file is damaged")
        return values


def _offsets(f: Path) -> dict[str, tuple[int, int]]:
    """Absolute byte ranges of the tensors of safetensors file ``f`` (its header: an 8-byte
    little-endian length, then JSON whose ``data_offsets`` count from the header's end)."""
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"}


def _expected(cfg: LlamaConfig, fam: Family, present: set[str]) -> dict[str, tuple[str | None, str, tuple[int, ...]]]:
    """Checkpoint name -> (layer field or None, weights key, shape) of every tensor the model uses."""
    shapes = layer_shapes(cfg)
    out: dict[str, tuple[str | None, str, tuple[int, ...]]] = {
        "model.embed_tokens.weight": (None, "tok_embd", (cfg.vocab, cfg.hidden)),
        "model.norm.weight": (None, "output_norm", (cfg.hidden,)),
    }
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = (None, "lm_head", (cfg.vocab, cfg.hidden))
    for i in range(cfg.n_layers):
        for field, required in fam.file_fields():
            name = f"model.layers.{i}.{fam.hf_name(field)}"
            if required or name in present:
                out[name] = (field, str(i), shapes[field])
    return out


def check_hf_tensors(path: Path, cfg: LlamaConfig, where: dict[str, tuple[Path, str, tuple[int, ...]]]) -> dict[str, tuple[str | None, str, tuple[int, ...]]]:
    """The tensors ``cfg`` uses (:func:`_expected`), after checking the checkpoint's table
    (``{name: (file, dtype, shape)}``) against them before anything is read: no tensor unused,
    none missing, every shape and dtype as expected. :class:`HFError` names the first mismatch."""
    layers = {n.split(".")[2] for n in where if n.startswith("model.layers.")}
    if cfg.n_layers > len(layers):  # counted before names are listed: a crafted count lists nothing
        raise HFError(f"{path}: config.json's num_hidden_layers {cfg.n_layers}, the checkpoint holds {len(layers)} layers")
    expected = _expected(cfg, FAMILIES[cfg.arch], set(where))
    unused = [n for n in where if n not in expected]
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise HFError(f"{path}: tensor {unused[0]!r}{more} is not used by sf_trt's {cfg.arch} decoder; refusing to ignore it")
    for name, (_, _, shape) in expected.items():
        if name not in where:
            raise HFError(f"{path}: the checkpoint has no tensor {name!r} (expected a {cfg.arch} model)")
        f, dtype, got = where[name]
        if got != shape:
            raise HFError(f"{f}: tensor {name!r} has shape {got}, config.json implies {shape}")
        if dtype not in DTYPES:
            raise HFError(f"{f}: tensor {name!r} is {dtype} (supported: {', '.join(DTYPES)})")
    return expected


def hf_tensor_table(path: str | os.PathLike) -> dict[str, tuple[Path, str, tuple[int, ...]]]:
    """``{name: (file, dtype, shape)}`` of every tensor of the checkpoint at ``path`` (headers only)."""
    return _Tensors(hf_files(path)).where


def load_hf(path: str | os.PathLike, progress: bool | Callable[[Iterable], Iterable] = False, *, lazy: bool = False) -> tuple[LlamaConfig, LlamaWeights]:
    """Config and float32 weights of the checkpoint directory ``path``; :class:`HFError` names
    a missing or unused tensor, a shape that disagrees with config.json, a dtype other than
    BF16/F16/F32, or a damaged file. ``progress`` and ``lazy`` as for
    :func:`~.gguf_llama.load_gguf` (the tensor table is checked before anything is read)."""
    d = Path(path)
    cfg, scaling = read_hf_config(d)
    fam = FAMILIES[cfg.arch]
    tensors = _Tensors(hf_files(d))
    expected = check_hf_tensors(d, cfg, tensors.where)
    by_field = {(key, field): name for name, (field, key, _) in expected.items()}
    shapes = layer_shapes(cfg)

    def field(i: int, f: str) -> LazyArray:
        src = fam.source_of(f)
        name = by_field[(str(i), src)]
        return LazyArray(shapes[f], lambda: layer_from_file(cfg, fam, {src: tensors.read(name)}, order="half", norm_offset=fam.hf_norm_offset)[f])

    def whole(key: str) -> LazyArray:
        name = by_field[(key, None)]
        return LazyArray(expected[name][2], lambda: tensors.read(name))

    layers = [
        LlamaLayerWeights(**{f: field(i, f) for f in fam.layer_fields if (str(i), fam.source_of(f)) in by_field})
        for i in range(cfg.n_layers)
    ]
    norm = tensors.read(by_field[("output_norm", None)]) + np.float32(fam.hf_norm_offset)
    weights = LlamaWeights(
        tok_embd=whole("tok_embd"), layers=layers, output_norm=norm.astype(np.float32),
        lm_head=whole("lm_head") if ("lm_head", None) in by_field else None, rope_factors=rope_factors(scaling, cfg, str(d / CONFIG)),
    )
    try:
        weights.check(cfg)
    except ValueError as exc:
        raise HFError(f"{d}: {exc}") from exc
    return cfg, (weights if lazy else materialized(weights, progress))


def read_hf_tokenizer(path: str | os.PathLike, cfg: LlamaConfig):
    """The checkpoint's tokenizer (``tokenizer.json``) with its chat template, bos and eos as
    ``config.json`` gives them. Refuses a tokenizer whose pieces are not byte-level BPE
    (sentencepiece-style ``▁`` pieces), which sf_trt's decoder would turn into the wrong text."""
    from tokenizers import Tokenizer as HFTokenizer

    from sf_trt.tokenizer import Tokenizer, TokenizerError

    d = Path(path)
    if not (d / "tokenizer.json").is_file():
        raise TokenizerError(f"{d}: no tokenizer.json (expected the checkpoint's tokenizer)")
    spec = _json(d / "tokenizer.json")
    decoder = spec.get("decoder") or {}
    steps = [s.get("type") for s in decoder.get("decoders", [])] if decoder.get("type") == "Sequence" else [decoder.get("type")]
    if steps != ["ByteLevel"] and "ByteFallback" not in steps:
        shown = "+".join(str(s) for s in steps)
        raise TokenizerError(f"{d / 'tokenizer.json'}: a {shown} decoder; sf_trt reads BPE tokenizers that are byte-level or sentencepiece's with byte fallback")
    try:
        hf = HFTokenizer.from_file(str(d / "tokenizer.json"))
    except Exception as exc:  # the tokenizers library raises its own Exception on a damaged file
        raise TokenizerError(f"{d / 'tokenizer.json'}: not a tokenizers file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    template = None
    if (d / "chat_template.jinja").is_file():
        template = (d / "chat_template.jinja").read_text(encoding="utf-8")
    elif (d / "tokenizer_config.json").is_file():
        found = _json(d / "tokenizer_config.json").get("chat_template")
        if isinstance(found, list):  # named templates: the default one
            found = next((t.get("template") for t in found if isinstance(t, dict) and t.get("name") == "default"), None)
        template = found if isinstance(found, str) else None
    return Tokenizer(hf, bos=cfg.bos, eos=cfg.eos, chat_template=template)
