"""The model directory: what ``sf-trt export`` writes and every backend reads.

A model directory holds one exported model, whatever made it (``sf-trt export``
or the first ``sf-trt generate``)::

    config.json              FORMAT_VERSION, the LlamaConfig ("llama"), the graph's
                             facts ("graph"), the weight dtype ("weights"), the
                             precision of the decoder's compute ("precision"), the GGUF
                             it came from ("gguf": path, sha256, name), the file list
                             ("files"), each file's sha256 ("sha256") and its own
                             ("config_sha256", over the rest of config.json)
    decoder.onnx             the decoder, "slots" form (TensorRT builds from it)
    decoder_pass.onnx        the decoder, "pass" form (onnxruntime on the CPU runs it)
    decoder.onnx.data        their shared weights (ONNX external data)
    verify.onnx              the verify-and-sample graph for the model's vocabulary
    tokenizer.json, tokenizer_config.json, chat_template.jinja   (sf_trt.tokenizer)

**Integrity.** :meth:`ModelDir.open` refuses a directory whose files differ
from the digests recorded at export, naming the file. A file is hashed the
first time it is checked and again whenever its size, mtime, ctime, inode or
device change; in between, the digest kept in ``.sf_trt-verified.json``
(:class:`~sf_trt.formats.files.DigestStamps`) stands for it, so a normal run
stats the files instead of reading 250-500 MB. (A change that keeps all five,
which takes deliberately resetting the clock, is not seen; a read-only
directory keeps no stamps and is hashed on every open.)

The decoder graph's inputs and outputs are named here (:data:`INPUTS`,
:data:`OUTPUTS`, :func:`cache_names`); ``sf_trt.export`` builds graphs with these
names and the backends feed them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from .files import STAMPS_NAME, DigestStamps

__all__ = [
    "FORMAT_VERSION", "CONFIG_FILE", "GRAPH_FILE", "PASS_GRAPH_FILE", "DATA_FILE", "VERIFY_FILE",
    "INPUTS", "OUTPUTS", "PASS_OUTPUTS", "CACHE_INPUTS", "PADDING_POSITION", "WEIGHT_DTYPES", "NBITS_WEIGHT_DTYPES", "DEFAULT_WEIGHTS", "AUTO_WEIGHTS", "WEIGHT_CHOICES",
    "PRECISIONS", "DEFAULT_PRECISION", "PRECISION_KEY", "graph_precision",
    "MAX_CONTEXT_LENGTH", "cache_names", "config_digest", "made_by_export", "LlamaConfig", "ModelDir",
    "ModelDirError",
]

FORMAT_VERSION = 13
"""Bumped whenever a graph or the layout changes: an older directory is rebuilt (5: verify.onnx always
there; 6: digests of every file, or the exact hash, on two branches; 7: both; 8: the decoder's
precision, its dim ``rows_per_lane``; 9: the pass form reads keys up to the pass's extent, q4 weights;
10: 9 and verify.onnx's ``min_p`` input, from two branches; 11: the config's family (``arch``), sliding
windows, local rope base and query scale; ``"gguf"`` (the source) records its ``kind``, gguf or hf;
12: the pass form reads its bound caches whole, their length the key extent the runtime chose, or
q4 carries Q4_0 and Q4_K blocks too and requantizes other matrices with zero points, not as Q4_1, on
two branches; 13: both)."""
CONFIG_FILE = "config.json"
GRAPH_FILE = "decoder.onnx"
PASS_GRAPH_FILE = "decoder_pass.onnx"
DATA_FILE = "decoder.onnx.data"
VERIFY_FILE = "verify.onnx"

INPUTS = ("input_ids", "positions", "lane_ids", "logit_index")
"""The decoder's per-pass inputs, "slots" form; the "pass" form has no ``lane_ids``."""
OUTPUTS = ("logits", "new_kv")
PASS_OUTPUTS = ("greedy_tokens",)
"""The pass form's extra output, computed from ``logits`` in the same run: each logit row's
``ArgMax`` (lowest id on ties, the verify graph's greedy op)."""
CACHE_INPUTS = ("pass", "slots")
"""The decoder's two forms, by how the KV caches come in (see ``sf_trt.export.decoder_graph``)."""
PADDING_POSITION = "max_context"
"""Padding rows sit at position ``max_context``: the cache's trash slot."""
WEIGHT_DTYPES = ("float32", "int8", "q4", "int4", "gguf")
NBITS_WEIGHT_DTYPES = ("q4", "int4", "gguf")
"""The weight dtypes held in onnxruntime's contrib ``MatMulNBits`` (a model directory for onnxruntime only)."""
DEFAULT_WEIGHTS = "int8"
"""What the CPU path exports unless ``auto`` finds a better form: a quarter of the weight bytes per
pass, rows still exact."""
AUTO_WEIGHTS = "auto"
"""The ``--weights`` choice that picks one of :data:`WEIGHT_DTYPES` per source by its size and block
types (``sf_trt.export.pipeline.auto_weights``); the default of the command line and ``LLM``."""
WEIGHT_CHOICES = (AUTO_WEIGHTS, *WEIGHT_DTYPES)
"""What a user may ask for: a weight dtype, or ``auto``."""
PRECISIONS = ("fp32", "fp16", "bf16")
"""The decoder's compute precision: the type of its weights, matmuls and KV cache
(``sf_trt.export.decoder_graph``, *Precision*); the verify graph and the copy model are fp32."""
DEFAULT_PRECISION = "fp32"
PRECISION_KEY = "sf_trt.precision"
"""The metadata key under which a graph records its precision (absent: fp32)."""
MAX_CONTEXT_LENGTH = 1 << 20
"""The longest context a model may declare (the graphs hold tables of that many positions)."""


def graph_precision(model: Any) -> str:
    """The precision an ONNX graph records (:data:`PRECISION_KEY`; fp32 when it records none).
    ``ValueError`` for a value outside :data:`PRECISIONS`."""
    found = next((p.value for p in model.metadata_props if p.key == PRECISION_KEY), DEFAULT_PRECISION)
    if found not in PRECISIONS:
        raise ValueError(f"graph metadata {PRECISION_KEY!r} is {found!r}; expected one of {', '.join(PRECISIONS)}")
    return found


def cache_names(layer: int) -> tuple[str, str]:
    """The decoder's cache inputs of ``layer``: ``(past_key_<layer>, past_value_<layer>)``."""
    return f"past_key_{layer}", f"past_value_{layer}"


class ModelDirError(ValueError):
    """A model directory that cannot be used; the message names the path and what is wrong."""


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama decoder, validated when constructed."""

    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context_length: int
    tied_embeddings: bool
    bos: int
    eos: int
    arch: str = "llama"
    """The family (``sf_trt.export.families``): the graph builder reads its declared differences."""
    sliding_window: int = 0
    """Keys a sliding layer's row at position ``p`` sees: ``p - sliding_window < j <= p`` (0: none)."""
    sliding_layers: tuple[int, ...] = ()
    """The layers that slide (the others attend to every key up to their position)."""
    rope_local_theta: float = 0.0
    """The rope base of the sliding layers (0: ``rope_theta``, and no table of their own)."""
    query_scale: float = 0.0
    """What q is multiplied by before ``q k^T`` (0: ``1 / sqrt(head_dim)``)."""

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"LlamaConfig: {name} must be a positive int (got {value!r})")
            object.__setattr__(self, name, int(value))
        if self.context_length > MAX_CONTEXT_LENGTH:
            raise ValueError(f"LlamaConfig: context_length {self.context_length} exceeds {MAX_CONTEXT_LENGTH}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim must be even for rotary embeddings (got {self.head_dim})")
        for name in ("rope_theta", "rms_eps"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), (int, float, np.floating, np.integer)):
                raise ValueError(f"LlamaConfig: {name} must be a number (got {getattr(self, name)!r})")
        if not (np.isfinite(self.rope_theta) and np.isfinite(self.rms_eps) and self.rope_theta > 0 and self.rms_eps > 0):
            raise ValueError(f"LlamaConfig: rope_theta and rms_eps must be > 0 (got {self.rope_theta}, {self.rms_eps})")
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rms_eps", float(self.rms_eps))
        object.__setattr__(self, "tied_embeddings", bool(self.tied_embeddings))
        if not isinstance(self.arch, str) or not self.arch:
            raise ValueError(f"LlamaConfig: arch must be a family name (got {self.arch!r})")
        window = self.sliding_window
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise ValueError(f"LlamaConfig: sliding_window must be an int >= 0 (got {window!r})")
        object.__setattr__(self, "sliding_window", int(window))
        layers = tuple(self.sliding_layers)
        if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n_layers for i in layers):
            raise ValueError(f"LlamaConfig: sliding_layers must be layer indices in 0..{self.n_layers - 1} (got {list(layers)})")
        if layers and not self.sliding_window:
            raise ValueError("LlamaConfig: sliding_layers given without a sliding_window")
        object.__setattr__(self, "sliding_layers", tuple(sorted({int(i) for i in layers})))
        for name in ("rope_local_theta", "query_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not np.isfinite(value) or value < 0:
                raise ValueError(f"LlamaConfig: {name} must be a number >= 0 (got {value!r})")
            object.__setattr__(self, name, float(value))
        for name in ("bos", "eos"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"LlamaConfig: {name} must be an int (got {value!r})")
            value = int(value)
            if not 0 <= value < self.vocab:
                raise ValueError(f"LlamaConfig: {name} token {value} outside 0..{self.vocab - 1}")
            object.__setattr__(self, name, value)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    @property
    def scale(self) -> float:
        """What q is multiplied by before ``q k^T``."""
        return self.query_scale or 1.0 / float(np.sqrt(self.head_dim))

    def slides(self, layer: int) -> bool:
        return layer in self.sliding_layers

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["sliding_layers"] = list(self.sliding_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        if not isinstance(d, dict):
            raise ValueError(f"LlamaConfig.from_dict: expected an object, got {type(d).__name__}")
        fields = dataclasses.fields(cls)
        names = {f.name for f in fields}
        missing = {f.name for f in fields if f.default is dataclasses.MISSING} - set(d)
        if missing:
            raise ValueError(f"LlamaConfig.from_dict: missing {sorted(missing)}")
        if not isinstance(d.get("sliding_layers", []), (list, tuple)):
            raise ValueError(f"LlamaConfig.from_dict: sliding_layers must be a list (got {d['sliding_layers']!r})")
        return cls(**{k: d[k] for k in names if k in d})



@dataclasses.dataclass(frozen=True)
class ModelDir:
    """An exported model directory, opened and checked (:meth:`open`)."""

    path: Path
    meta: dict[str, Any]
    config: LlamaConfig

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True) -> "ModelDir":
        """Read ``config.json``, check its format, its own digest and that every
        listed file is there; with ``verify`` (the default) also that every file
        matches the digest recorded at export (see *Integrity* above).
        :class:`ModelDirError` names the file and what is wrong."""
        d = Path(path)
        if not d.is_dir():
            raise ModelDirError(f"{d}: {'not a directory' if d.exists() else 'no such directory'} (expected a model directory written by `sf-trt export`)")
        cfg_path = d / CONFIG_FILE
        if not cfg_path.is_file():
            raise ModelDirError(f"{d}: no {CONFIG_FILE} (expected a model directory written by `sf-trt export`)")
        meta = _read_config(cfg_path)
        for name in meta["files"]:
            if (d / name).is_symlink():  # its digest would be of a file outside: not the directory's own
                raise ModelDirError(f"{d}: {name} is a symbolic link to {os.readlink(d / name)}; a model directory's files are its own (re-export the model)")
            if not (d / name).is_file():
                raise ModelDirError(f"{d}: {name} is missing (the export is incomplete; re-export the model)")
        try:
            config = LlamaConfig.from_dict(meta["llama"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelDirError(f"{cfg_path}: no usable \"llama\" config ({exc})") from None
        found = cls(d, meta, config)
        if verify:
            found.verify()
        return found

    def verify(self) -> None:
        """Check every file against the digest recorded at export (hashing only the
        files whose stat facts changed since they last matched)."""
        stamps = DigestStamps(self.path)
        damaged = []
        try:
            for name, expected in sorted(self.meta["sha256"].items()):
                try:
                    digest = stamps.sha256(name)
                except OSError as exc:
                    raise ModelDirError(f"{self.path / name}: cannot be read ({exc.strerror or exc})") from None
                if digest != expected:
                    stamps.forget(name)
                    damaged.append(name)
        finally:
            stamps.save()
        if damaged:
            more = f" (and {len(damaged) - 1} more: {', '.join(damaged[1:])})" if len(damaged) > 1 else ""
            raise ModelDirError(
                f"{self.path / damaged[0]}: sha256 differs from the digest recorded at export{more}; "
                "the file is damaged or was changed (re-export the model with `sf-trt export`)"
            )

    @property
    def weights(self) -> str:
        """The weight dtype the decoder was exported with (:data:`WEIGHT_DTYPES`)."""
        return self.meta.get("weights", "float32")

    @property
    def precision(self) -> str:
        """The decoder's compute precision (:data:`PRECISIONS`)."""
        return self.meta["precision"]

    @property
    def max_positions(self) -> int:
        """The longest context the graphs take (the model's context length)."""
        return int(self.meta["graph"].get("max_positions", self.config.context_length))

    @property
    def gguf_sha256(self) -> str | None:
        return self.meta["gguf"].get("sha256")

    def graph_file(self, cache_inputs: str) -> Path:
        """The decoder graph of form ``cache_inputs`` (:data:`CACHE_INPUTS`)."""
        if cache_inputs not in CACHE_INPUTS:
            raise ModelDirError(f"{self.path}: decoder form {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
        return self.path / (PASS_GRAPH_FILE if cache_inputs == "pass" else GRAPH_FILE)


_HEX64 = frozenset("0123456789abcdef")


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64


def config_digest(meta: dict[str, Any]) -> str:
    """The sha256 of ``config.json``'s content other than ``"config_sha256"``
    (canonical JSON: sorted keys, no spaces), which records it."""
    body = {k: v for k, v in meta.items() if k != "config_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _read_config(cfg_path: Path) -> dict[str, Any]:
    """``config.json`` parsed and its structure checked: the format, the file
    list, the digests (of the files and of itself), the sections' types."""
    try:
        meta = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelDirError(f"{cfg_path}: not readable JSON ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelDirError(f"{cfg_path}: format {found!r}, expected {FORMAT_VERSION} (re-export the model)")

    def bad(what: str) -> ModelDirError:
        return ModelDirError(f"{cfg_path}: {what} (damaged; re-export the model)")

    if meta.get("config_sha256") != config_digest(meta):
        raise bad("its content differs from the digest it records (config_sha256)")
    files, digests = meta.get("files"), meta.get("sha256")
    if not isinstance(files, list) or not all(isinstance(n, str) and n and n == Path(n).name and n not in (".", "..") for n in files):
        raise bad('"files" is not a list of file names')
    if not isinstance(digests, dict) or set(digests) != set(files) - {CONFIG_FILE} or not all(map(_is_sha256, digests.values())):
        raise bad('"sha256" does not hold one sha256 per listed file')
    for key in ("llama", "graph", "gguf"):
        if not isinstance(meta.get(key), dict):
            raise bad(f"{key!r} is not an object")
    if meta.get("weights") not in WEIGHT_DTYPES:
        raise bad(f"weights {meta.get('weights')!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    if meta.get("precision") not in PRECISIONS:
        raise bad(f"precision {meta.get('precision')!r} unknown (known: {', '.join(PRECISIONS)})")
    positions = meta["graph"].get("max_positions", 2)
    if isinstance(positions, bool) or not isinstance(positions, int) or not 2 <= positions <= MAX_CONTEXT_LENGTH:
        raise bad(f"graph max_positions {positions!r} is not a context length")
    return meta


def made_by_export(path: str | os.PathLike) -> bool:
    """Whether directory ``path`` holds only what an sf_trt export wrote: its
    ``config.json`` lists every other entry (any format version), or it is the
    digest stamps. Such a directory may be replaced by a new export."""
    d = Path(path)
    try:
        meta = json.loads((d / CONFIG_FILE).read_bytes().decode("utf-8"))
        entries = {p.name for p in d.iterdir()}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    if not isinstance(meta, dict) or not isinstance(meta.get("format"), int) or not isinstance(meta.get("files"), list):
        return False
    return entries <= {n for n in meta["files"] if isinstance(n, str)} | {CONFIG_FILE, STAMPS_NAME}
