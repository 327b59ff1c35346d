"""What a model file or directory holds, and whether sf_trt supports it, before any export.

:func:`describe` reads headers only (a GGUF's metadata and tensor table, a checkpoint's
config.json and safetensors headers, a model directory's config.json) and runs the same checks
an export runs before it reads a weight, so "supported" means the export's checks pass and
"not supported" carries the export's own one-line reason.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["describe", "render"]


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """``{"path", "kind" (gguf | hf | model_dir), "supported", "reason", "architecture", "config",
    "tensor_types", "tensors", "parameters", "context_length", "chat_template", "tokenizer"}`` of
    ``path`` (keys that do not apply are left out)."""
    from sf_trt.formats.model_dir import CONFIG_FILE

    p = Path(path)
    if p.is_dir() and (p / CONFIG_FILE).is_file():
        try:
            meta = json.loads((p / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            meta = {}
        if isinstance(meta, dict) and "format" in meta and "llama" in meta:
            return _model_dir(p)
        return _hf(p)
    return _gguf(p)


def _config_facts(cfg) -> dict[str, Any]:
    facts = cfg.to_dict()
    facts["context_length"] = cfg.context_length
    return facts


def _gguf(p: Path) -> dict[str, Any]:
    from .gguf_llama import GGUFError, _field, check_tensors, open_reader, read_config, read_tokenizer

    out: dict[str, Any] = {"path": str(p), "kind": "gguf"}
    try:
        reader = open_reader(p)
    except GGUFError as exc:
        return {**out, "supported": False, "reason": str(exc)}
    tensors = list(reader.tensors)
    out["architecture"] = _field(reader, "general.architecture", None, required=False)
    out["name"] = _field(reader, "general.name", None, required=False)
    out["tensors"] = len(tensors)
    out["parameters"] = int(sum(int(t.n_elements) for t in tensors))
    out["tensor_types"] = dict(collections.Counter(t.tensor_type.name for t in tensors).most_common())
    out["chat_template"] = isinstance(_field(reader, "tokenizer.chat_template", None, required=False), str)
    out["tokenizer"] = _field(reader, "tokenizer.ggml.model", None, required=False)
    try:
        cfg = read_config(reader)
        out["config"] = _config_facts(cfg)
        check_tensors(reader, cfg)
    except (GGUFError, ValueError) as exc:
        return {**out, "supported": False, "reason": str(exc)}
    try:
        read_tokenizer(reader)
    except ValueError as exc:
        return {**out, "supported": False, "reason": f"the graphs export, the tokenizer does not: {exc}"}
    return {**out, "supported": True}


def _hf(p: Path) -> dict[str, Any]:
    from sf_trt.tokenizer import TokenizerError

    from .hf_checkpoint import HFError, check_hf_tensors, hf_tensor_table, read_hf_config, read_hf_tokenizer

    out: dict[str, Any] = {"path": str(p), "kind": "hf"}
    try:
        conf = json.loads((p / "config.json").read_text())
        out["architecture"] = conf.get("model_type") if isinstance(conf, dict) else None
    except (OSError, ValueError):
        pass
    try:
        table = hf_tensor_table(p)
        out["tensors"] = len(table)
        out["tensor_types"] = dict(collections.Counter(dtype for _, dtype, _ in table.values()).most_common())
        out["parameters"] = int(sum(_count(shape) for _, _, shape in table.values()))
        out["chat_template"] = (p / "chat_template.jinja").is_file() or "chat_template" in _json_or_empty(p / "tokenizer_config.json")
        cfg, _ = read_hf_config(p)
        out["config"] = _config_facts(cfg)
        check_hf_tensors(p, cfg, table)
        read_hf_tokenizer(p, cfg)
    except (HFError, TokenizerError) as exc:
        return {**out, "supported": False, "reason": str(exc)}
    return {**out, "supported": True}


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_dir(p: Path) -> dict[str, Any]:
    from sf_trt.formats.model_dir import ModelDir, ModelDirError

    out: dict[str, Any] = {"path": str(p), "kind": "model_dir"}
    try:
        found = ModelDir.open(p)
    except ModelDirError as exc:
        return {**out, "supported": False, "reason": str(exc)}
    cfg = found.config
    return {
        **out, "supported": True, "architecture": cfg.arch, "config": _config_facts(cfg), "weights": found.weights,
        "precision": found.precision, "chat_template": (p / "chat_template.jinja").is_file(), "source": found.meta.get("gguf"),
    }


def render(facts: dict[str, Any]) -> str:
    """The facts as a few lines of text, the verdict last."""
    lines = [f"{facts['path']}: {facts['kind']}"]
    if facts.get("architecture") is not None:
        lines.append(f"  architecture  {facts['architecture']}" + (f" ({facts['name']})" if facts.get("name") else ""))
    cfg = facts.get("config")
    if cfg:
        window = f", sliding window {cfg['sliding_window']} on {len(cfg['sliding_layers'])} of {cfg['n_layers']} layers" if cfg["sliding_window"] else ""
        lines.append(
            f"  shape         {cfg['n_layers']} layers, hidden {cfg['hidden']}, heads {cfg['n_heads']}/{cfg['n_kv_heads']} kv, "
            f"head dim {cfg['head_dim']}, ffn {cfg['ffn']}, vocab {cfg['vocab']}{window}"
        )
        lines.append(f"  context       {cfg['context_length']}")
    if "parameters" in facts:
        types = ", ".join(f"{k} x{v}" for k, v in facts["tensor_types"].items())
        lines.append(f"  tensors       {facts['tensors']} ({facts['parameters'] / 1e6:.1f}M parameters): {types}")
    for key in ("weights", "precision", "tokenizer"):
        if facts.get(key) is not None:
            lines.append(f"  {key:<13} {facts[key]}")
    if "chat_template" in facts:
        lines.append(f"  chat template {'yes' if facts['chat_template'] else 'no'}")
    lines.append("  supported     yes" if facts["supported"] else f"  supported     no: {facts['reason']}")
    return "\n".join(lines)
