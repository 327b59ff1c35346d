"""GGUF to model directory: the export pipeline.

:func:`export_model_dir` reads a Llama GGUF, builds the decoder graph (both
forms), the verify-and-sample graph for its vocabulary and the tokenizer, and
writes them as a model directory (:mod:`sf_trt.formats.model_dir`). Whichever
command asks for it (``sf-trt export``, or ``sf-trt generate`` on first use),
the directory holds the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import onnx

from sf_trt.formats.files import sha256_file
from sf_trt.formats.model_dir import (
    CONFIG_FILE, DATA_FILE, DEFAULT_WEIGHTS, FORMAT_VERSION, GRAPH_FILE, PASS_GRAPH_FILE, VERIFY_FILE, WEIGHT_DTYPES,
    LlamaConfig, ModelDir, ModelDirError, graph_facts,
)
from sf_trt.graphs.verify import build_verify_graph
from sf_trt.models import default_gguf_path, export_dir

from .decoder_graph import build_decoder_graph, pass_form
from .gguf_llama import load_gguf, open_reader, read_tokenizer

__all__ = ["default_model_dir", "export_model_dir", "write_model_dir"]


def export_model_dir(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, progress: bool = True, *, weight_dtype: str = "float32"
) -> Path:
    """Write (or reuse) an onnxruntime/TensorRT-ready model directory for a GGUF.

    A directory whose recorded GGUF digest, weight dtype and format match and
    whose files are all present is reused as it is. ``weight_dtype``:
    ``"float32"`` (the GGUF's values exactly) or ``"int8"`` (see
    :func:`~sf_trt.export.decoder_graph.build_decoder_graph`). Progress goes
    to stderr.
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"export_model_dir: weight_dtype {weight_dtype!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    out = Path(out_dir)
    say = _say if progress else (lambda msg: None)
    digest = sha256_file(gguf_path)
    try:
        found = ModelDir.open(out)
        if found.gguf_sha256 == digest and found.weights == weight_dtype:
            return out
        say(f"{out}: built from another GGUF or weight dtype; rebuilding")
    except ModelDirError:
        pass
    t0 = time.perf_counter()
    say(f"reading {gguf_path}")
    reader = open_reader(gguf_path)
    cfg, weights = load_gguf(reader, progress=progress)
    tok = read_tokenizer(reader)
    say(f"building the decoder graph ({cfg.n_layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab})")
    model = build_decoder_graph(cfg, weights, weight_dtype=weight_dtype)
    del weights
    name = reader.fields.get("general.name")
    source = {"path": str(Path(gguf_path).resolve()), "sha256": digest, "name": None if name is None else name.contents()}
    write_model_dir(out, cfg, model, tok, source, weight_dtype)
    say(f"exported {out} in {time.perf_counter() - t0:.1f}s")
    return out


def default_model_dir(
    cache: Path | None = None, *, progress: bool = True, download: bool = True, weight_dtype: str = DEFAULT_WEIGHTS
) -> Path:
    """The default model (:data:`sf_trt.models.DEFAULT_MODEL`) fetched and exported
    into the cache (built once, then reused); ``weight_dtype`` as for
    :func:`export_model_dir`."""
    gguf = default_gguf_path(cache, progress=progress, download=download)
    return export_model_dir(gguf, export_dir(gguf, weight_dtype, cache), progress=progress, weight_dtype=weight_dtype)


def _say(msg: str) -> None:
    import sys

    print(f"sf_trt: {msg}", file=sys.stderr, flush=True)


def write_model_dir(
    out_dir: str | os.PathLike,
    cfg: LlamaConfig,
    model: onnx.ModelProto,
    tokenizer: Any = None,
    source: dict[str, Any] | None = None,
    weight_dtype: str = "float32",
) -> Path:
    """Write a model directory: the decoder ``model`` (slots form, weights as
    external data), its pass form, the verify graph, ``config.json`` and, when
    given, the tokenizer files. ``source`` is recorded as ``config.json["gguf"]``.

    Written into a temporary directory beside ``out_dir`` and renamed into
    place, so an interrupted write never leaves a half-written model behind.
    """
    if "lane_ids" not in {i.name for i in model.graph.input}:
        raise ValueError("write_model_dir: expected the slots form of the decoder graph (build_decoder_graph's default)")

    def fill(tmp: Path) -> None:
        onnx.save_model(
            model, str(tmp / GRAPH_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
            location=DATA_FILE, size_threshold=1024,
        )
        # the pass form references the same weight file (its initializers now point there)
        onnx.save_model(pass_form(onnx.load(str(tmp / GRAPH_FILE), load_external_data=False)), str(tmp / PASS_GRAPH_FILE))
        onnx.save_model(build_verify_graph(cfg.vocab), str(tmp / VERIFY_FILE))
        if tokenizer is not None:
            tokenizer.save(tmp)
        files = sorted(p.name for p in tmp.iterdir())
        meta = {
            "format": FORMAT_VERSION,
            "llama": cfg.to_dict(),
            "graph": graph_facts(cfg),
            "weights": weight_dtype,
            "gguf": source or {},
            "files": files + [CONFIG_FILE],
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    return _write_dir_atomically(Path(out_dir), fill)


def _write_dir_atomically(out: Path, fill: Callable[[Path], None]) -> Path:
    """Run ``fill`` on a temporary directory beside ``out``, then rename it over ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        for p in tmp.iterdir():
            os.chmod(p, 0o666 & ~umask)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
