"""The model directory: what ``sf-trt export`` writes and every backend reads.

A model directory holds one exported model, whatever made it (``sf-trt export``
or the first ``sf-trt generate``)::

    config.json              FORMAT_VERSION, the LlamaConfig ("llama"), the graph's
                             facts ("graph"), the weight dtype ("weights"), the GGUF
                             it came from ("gguf": path, sha256, name), the file list
    decoder.onnx             the decoder, "slots" form (TensorRT builds from it)
    decoder_pass.onnx        the decoder, "pass" form (onnxruntime on the CPU runs it)
    decoder.onnx.data        their shared weights (ONNX external data)
    verify.onnx              the verify-and-sample graph for the model's vocabulary
    tokenizer.json, tokenizer_config.json, chat_template.jinja   (sf_trt.tokenizer)

The decoder graph's inputs and outputs are named here (:data:`INPUTS`,
:data:`OUTPUTS`, :func:`cache_names`); ``sf_trt.export`` builds graphs with these
names and the backends feed them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION", "CONFIG_FILE", "GRAPH_FILE", "PASS_GRAPH_FILE", "DATA_FILE", "VERIFY_FILE",
    "INPUTS", "OUTPUTS", "CACHE_INPUTS", "PADDING_POSITION", "WEIGHT_DTYPES", "DEFAULT_WEIGHTS",
    "cache_names", "graph_facts", "LlamaConfig", "ModelDir", "ModelDirError",
]

FORMAT_VERSION = 5
"""Bumped whenever a graph or the layout changes: an older directory is rebuilt (5: verify.onnx always there)."""
CONFIG_FILE = "config.json"
GRAPH_FILE = "decoder.onnx"
PASS_GRAPH_FILE = "decoder_pass.onnx"
DATA_FILE = "decoder.onnx.data"
VERIFY_FILE = "verify.onnx"

INPUTS = ("input_ids", "positions", "lane_ids", "logit_index")
"""The decoder's per-pass inputs, "slots" form; the "pass" form has no ``lane_ids``."""
OUTPUTS = ("logits", "new_kv")
CACHE_INPUTS = ("pass", "slots")
"""The decoder's two forms, by how the KV caches come in (see ``sf_trt.export.decoder_graph``)."""
PADDING_POSITION = "max_context"
"""Padding rows sit at position ``max_context``: the cache's trash slot."""
WEIGHT_DTYPES = ("float32", "int8")
DEFAULT_WEIGHTS = "int8"
"""What the CPU path exports by default: a quarter of the weight bytes per pass, rows still exact."""


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

    def __post_init__(self) -> None:
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"LlamaConfig: {name} must be a positive int (got {value!r})")
            object.__setattr__(self, name, int(value))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim must be even for rotary embeddings (got {self.head_dim})")
        if not (self.rope_theta > 0 and self.rms_eps > 0):
            raise ValueError(f"LlamaConfig: rope_theta and rms_eps must be > 0 (got {self.rope_theta}, {self.rms_eps})")
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rms_eps", float(self.rms_eps))
        object.__setattr__(self, "tied_embeddings", bool(self.tied_embeddings))
        for name in ("bos", "eos"):
            value = int(getattr(self, name))
            if not 0 <= value < self.vocab:
                raise ValueError(f"LlamaConfig: {name} token {value} outside 0..{self.vocab - 1}")
            object.__setattr__(self, name, value)

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = names - set(d)
        if missing:
            raise ValueError(f"LlamaConfig.from_dict: missing {sorted(missing)}")
        return cls(**{k: d[k] for k in names})



@dataclasses.dataclass(frozen=True)
class ModelDir:
    """An exported model directory, opened and checked (:meth:`open`)."""

    path: Path
    meta: dict[str, Any]
    config: LlamaConfig

    @classmethod
    def open(cls, path: str | os.PathLike) -> "ModelDir":
        """Read ``config.json`` and check the format and that every listed file is there."""
        d = Path(path)
        cfg_path = d / CONFIG_FILE
        if not cfg_path.is_file():
            raise ModelDirError(f"{d}: no {CONFIG_FILE} (expected a model directory written by `sf-trt export`)")
        try:
            meta = json.loads(cfg_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelDirError(f"{cfg_path}: not readable JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
            found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
            raise ModelDirError(f"{cfg_path}: format {found!r}, expected {FORMAT_VERSION} (re-export the model)")
        for name in meta.get("files", []):
            if not (d / name).is_file():
                raise ModelDirError(f"{d}: {name} is missing (the export is incomplete)")
        try:
            config = LlamaConfig.from_dict(meta["llama"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelDirError(f"{cfg_path}: no usable \"llama\" config ({exc})") from None
        return cls(d, meta, config)

    @property
    def weights(self) -> str:
        """The weight dtype the decoder was exported with (:data:`WEIGHT_DTYPES`)."""
        return self.meta.get("weights", "float32")

    @property
    def max_positions(self) -> int:
        """The longest context the graphs take (the model's context length)."""
        return int(self.meta.get("graph", {}).get("max_positions", self.config.context_length))

    @property
    def gguf_sha256(self) -> str | None:
        return self.meta.get("gguf", {}).get("sha256")

    def graph_file(self, cache_inputs: str) -> Path:
        """The decoder graph of form ``cache_inputs`` (:data:`CACHE_INPUTS`)."""
        if cache_inputs not in CACHE_INPUTS:
            raise ModelDirError(f"{self.path}: decoder form {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
        return self.path / (PASS_GRAPH_FILE if cache_inputs == "pass" else GRAPH_FILE)


def graph_facts(cfg: LlamaConfig) -> dict[str, Any]:
    """What ``config.json["graph"]`` records about the decoder graphs."""
    from ..graphs.builder import OPSET

    return {
        "opset": OPSET,
        "graphs": {GRAPH_FILE: "slots", PASS_GRAPH_FILE: "pass"},
        "inputs": list(INPUTS) + ["past_key_{i}", "past_value_{i}"],
        "outputs": list(OUTPUTS),
        "cache_layout": "[max_lanes (slots form) or batch (pass form), n_kv_heads, max_context + 1, head_dim] float32; position max_context is the trash slot",
        "new_kv_layout": "[n_layers, 2 (key, value), batch, rows, n_kv_heads, head_dim] float32",
        "padding_position": PADDING_POSITION,
        "rope": "interleaved pairs (GGUF q/k row order)",
        "max_positions": cfg.context_length,
        "dynamic_dims": ["batch", "rows", "logit_rows", "max_lanes", "cache_len"],
    }
