"""GGUF to model directory: the export pipeline.

:func:`export_model_dir` reads a GGUF or a Hugging Face checkpoint, builds the decoder graph (both
forms), the verify-and-sample graph for its vocabulary and the tokenizer, and
writes them as a model directory (:mod:`sf_trt.formats.model_dir`). Whichever
command asks for it (``sf-trt export``, or ``sf-trt generate`` on first use),
the directory holds the same files.

Nothing it did not make is lost: a directory that holds other files is
refused (unless ``force``); an export is written beside its place and renamed
in (:func:`sf_trt.formats.files.replace_dir`); its temporary directory is
removed on an exception, Ctrl-C, SIGTERM or SIGHUP, and one left by a killed
process is removed by the next export to that place.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from sf_trt.formats.files import check_writable_dir, removed_on_signal, replace_dir, sha256_file, sweep_stale, temp_path
from sf_trt.formats.model_dir import (
    CONFIG_FILE, DATA_FILE, DEFAULT_PRECISION, DEFAULT_WEIGHTS, FORMAT_VERSION, GRAPH_FILE, INPUTS, OUTPUTS, PADDING_POSITION,
    NBITS_WEIGHT_DTYPES, PASS_GRAPH_FILE, PRECISIONS,
    VERIFY_FILE, WEIGHT_DTYPES, LlamaConfig, ModelDir, ModelDirError, config_digest, graph_precision,
    made_by_export,
)
from sf_trt.models import DEFAULT_MODEL, cache_lock, default_gguf_path, export_dir


# onnx and the graph builders are imported by the functions that build: finding an
# exported model (default_model_dir's usual path) imports neither (docs/benchmarks.md:
# onnx alone is ~20 MB of a generate's peak RSS)
__all__ = [
    "default_model_dir", "export_model_dir", "write_model_dir", "check_out_dir", "check_weight_dtype", "read_source", "source_digest",
    "graph_facts", "OutDirError", "ExportError", "auto_weights", "AUTO_NBITS_PARAMETERS",
]

AUTO_NBITS_PARAMETERS = 1_000_000_000
"""``--weights auto`` keeps a GGUF's own blocks (``gguf``) from this many parameters up: there a
decode pass is a read of every weight, and 4-bit blocks read half int8's bytes (a one-row pass of
a 1.1B Q4_0 model in 0.68x int8's time). Below it a pass is per-op overhead: at 135M 4-bit
decode is level with int8 and 9-row verify passes are 4-10% slower (docs/benchmarks.md,
"4-bit weights from GGUF blocks")."""
_FOUR_BIT_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})
_GGUF_CARRIED_TYPES = _FOUR_BIT_TYPES | {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "F16", "F32"}
"""Tensor types ``--weights gguf`` holds without changing a value."""


class OutDirError(ModelDirError):
    """The place an export would go holds something an export did not write."""


class ExportError(ModelDirError):
    """A model whose export cannot be made as asked (``--weights q4`` on dimensions 4-bit blocks do not divide)."""


def check_weight_dtype(cfg: LlamaConfig, weight_dtype: str) -> None:
    """:class:`ExportError` when ``weight_dtype`` cannot hold ``cfg``'s matrices: q4, int4 and gguf keep each layer
    matrix's input dim in blocks of 32 (hidden, heads x head dim, ffn); the error names each matrix
    that does not divide, its shape ``[out, in]`` and the block."""
    from .families import GGUF_LAYER_NAMES, family
    from .gguf_llama import layer_shapes
    from .quantize import BLOCK

    if weight_dtype not in NBITS_WEIGHT_DTYPES:
        return
    shapes = layer_shapes(cfg)
    mats = [f for f in family(cfg.arch).layer_fields if f.startswith("w")]
    bad = [f"blk.*.{GGUF_LAYER_NAMES[f]} [{shapes[f][0]}, {shapes[f][1]}]" for f in mats if shapes[f][1] % BLOCK]
    if bad:
        dims, verb = ("input dim (the last)", "is") if len(bad) == 1 else ("input dims (the last)", "are")
        raise ExportError(
            f"--weights {weight_dtype}: the {dims} of {', '.join(bad)} {verb} not a multiple of the block {BLOCK} "
            "(use --weights int8 or float32)"
        )


def auto_weights(source: str | os.PathLike | None, precision: str = DEFAULT_PRECISION) -> tuple[str, str]:
    """What ``--weights auto`` exports ``source`` (a GGUF, a checkpoint directory, or None for the
    default model) with, and why in a few words: ``gguf`` for a float32-compute export of a GGUF of
    at least :data:`AUTO_NBITS_PARAMETERS` parameters with 4-bit blocks, every tensor in a type
    ``gguf`` carries and every layer matrix in whole blocks; :data:`DEFAULT_WEIGHTS` otherwise.
    Reads the GGUF's header only."""
    from .gguf_llama import GGUFError, open_reader, read_config

    if source is None or Path(source).is_dir():
        return DEFAULT_WEIGHTS, "the default model" if source is None else "a checkpoint's float weights"
    if precision != "fp32":
        return DEFAULT_WEIGHTS, f"--precision {precision} (4-bit blocks compute in fp32)"
    try:
        reader = open_reader(source)
        cfg = read_config(reader)
    except (GGUFError, ValueError) as exc:
        return DEFAULT_WEIGHTS, f"its header did not read ({exc})"
    parameters = sum(int(t.n_elements) for t in reader.tensors)
    types = {t.tensor_type.name for t in reader.tensors}
    if parameters < AUTO_NBITS_PARAMETERS:
        return DEFAULT_WEIGHTS, f"{parameters / 1e6:.0f}M parameters, under {AUTO_NBITS_PARAMETERS / 1e9:g}B"
    if not types & _FOUR_BIT_TYPES or not types <= _GGUF_CARRIED_TYPES:
        return DEFAULT_WEIGHTS, f"its tensor types {', '.join(sorted(types))} are not 4-bit GGUF blocks gguf carries"
    try:
        check_weight_dtype(cfg, "gguf")
    except ExportError as exc:
        return DEFAULT_WEIGHTS, str(exc)
    return "gguf", f"{parameters / 1e9:.1f}B parameters in 4-bit GGUF blocks ({', '.join(sorted(types & _FOUR_BIT_TYPES))}), kept as they are"


def export_model_dir(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    progress: bool = True,
    *,
    weight_dtype: str = "float32",
    precision: str = DEFAULT_PRECISION,
    force: bool = False,
    gguf_sha256: str | None = None,
) -> Path:
    """Write (or reuse) an onnxruntime/TensorRT-ready model directory for a GGUF file, or for a
    Hugging Face checkpoint directory (:mod:`~sf_trt.export.hf_checkpoint`) when ``gguf_path``
    is a directory.

    A directory whose recorded source digest, weight dtype, precision and format match and
    whose files match their digests is reused as it is; another export (or a
    damaged one) there is replaced; a directory holding anything else is
    refused with :class:`OutDirError` unless ``force``. ``weight_dtype``:
    ``"float32"`` (the source's values exactly) or ``"int8"`` (see
    :func:`~sf_trt.export.decoder_graph.build_decoder_graph`); ``precision``: the
    decoder's compute type (:data:`~sf_trt.formats.model_dir.PRECISIONS`).
    ``gguf_sha256``: the source's digest when the caller has checked it already.
    Progress goes to stderr.
    """
    from .decoder_graph import build_decoder_graph  # the build side, imported when a build runs

    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"export_model_dir: weight_dtype {weight_dtype!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    if precision not in PRECISIONS:
        raise ValueError(f"export_model_dir: precision {precision!r} unknown (known: {', '.join(PRECISIONS)})")
    if weight_dtype in NBITS_WEIGHT_DTYPES and precision != DEFAULT_PRECISION:
        raise ExportError(f"--weights {weight_dtype} --precision {precision}: {weight_dtype} weights compute in onnxruntime's "
                          f"MatMulNBits at {DEFAULT_PRECISION}; --precision {precision} is for --weights float32 or int8")
    out = Path(out_dir)
    say = _say if progress else (lambda msg: None)
    sweep_stale(out)  # what killed exports to this place left behind
    digest = gguf_sha256 or source_digest(gguf_path)
    try:
        found = ModelDir.open(out)
        if found.gguf_sha256 == digest and found.weights == weight_dtype and found.precision == precision:
            return out
        reason = "it holds an export of another source, weight dtype or precision"
    except ModelDirError as exc:
        reason = str(exc)
    check_out_dir(out, force=force)
    if out.exists():
        say(f"rebuilding {out}: {reason}")
    t0 = time.perf_counter()
    say(f"reading {gguf_path}")
    cfg, weights, tok, source = read_source(gguf_path)
    check_weight_dtype(cfg, weight_dtype)
    rounded = sorted({kind for kind, _ in weights.blocks.values() if kind in _FOUR_BIT_TYPES}) if weight_dtype == "int4" else []
    if rounded:
        say(f"--weights int4 requantizes the file's {', '.join(rounded)} blocks too, rounding their values a second time "
            "(--weights gguf keeps them as they are; tools/q4_error.py --weights int4 measures by how much)")
    say(f"building the decoder graph ({cfg.arch}, {cfg.n_layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab}, {precision})")
    def build(data_file: Path) -> Any:  # weights written as the graph is built (streamed from the source)
        return build_decoder_graph(cfg, weights, weight_dtype=weight_dtype, precision=precision, external_data=data_file)

    write_model_dir(out, cfg, build, tok, {**source, "sha256": digest}, weight_dtype, force=force)
    say(f"exported {out} in {time.perf_counter() - t0:.1f}s")
    return out


def source_digest(path: str | os.PathLike) -> str:
    """The sha256 of a GGUF file; of a checkpoint directory, the sha256 over its files' names and
    digests (config, weights, tokenizer)."""
    from .hf_checkpoint import TOKENIZER_FILES, hf_files, is_hf_dir

    if not is_hf_dir(path):
        return sha256_file(path)
    d = Path(path)
    names = ["config.json", *(p.name for p in hf_files(d)), "model.safetensors.index.json", *TOKENIZER_FILES]
    listing = "".join(f"{n} {sha256_file(d / n)}\n" for n in dict.fromkeys(names) if (d / n).is_file())
    return hashlib.sha256(listing.encode()).hexdigest()


def read_source(path: str | os.PathLike) -> tuple[LlamaConfig, Any, Any, dict[str, Any]]:
    """``(config, weights, tokenizer, source facts)`` of a GGUF file or a checkpoint directory; the
    weights checked, their values read (dequantized) only when the graph takes them."""
    from .hf_checkpoint import is_hf_dir, load_hf, read_hf_tokenizer

    if is_hf_dir(path):
        cfg, weights = load_hf(path, lazy=True)
        return cfg, weights, read_hf_tokenizer(path, cfg), {"kind": "hf", "path": str(Path(path).resolve()), "name": Path(path).name}
    from .gguf_llama import load_gguf, model_name, open_reader, read_tokenizer

    reader = open_reader(path)
    cfg, weights = load_gguf(reader, lazy=True)
    return cfg, weights, read_tokenizer(reader), {"kind": "gguf", "path": str(Path(path).resolve()), "name": model_name(reader)}


def check_out_dir(out: str | os.PathLike, *, force: bool = False) -> Path:
    """Check that an export may be written at ``out``, before any work: absent,
    an empty directory, or a directory an export wrote (replaced) are fine;
    anything else is :class:`OutDirError` unless ``force``. The parent must be
    writable (:class:`~sf_trt.formats.files.NotWritable`). Temporaries of
    killed exports to ``out`` are removed. Returns ``out`` (a symbolic link
    resolved: the export replaces what it points to)."""
    out = Path(out)
    if out.is_symlink():
        out = out.resolve()
    if not force and (out.exists() or out.is_symlink()):
        if not out.is_dir():
            raise OutDirError(f"{out}: is a file, not a model directory; refusing to replace it")
        try:
            entries = sorted(p.name for p in out.iterdir())
        except OSError as exc:
            raise OutDirError(f"{out}: cannot be listed ({exc.strerror or exc})") from None
        if entries and not made_by_export(out):
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise OutDirError(f"{out}: not empty and not an sf_trt model directory (holds {shown}); refusing to replace it")
    check_writable_dir(out.parent, "model directory")
    sweep_stale(out)
    return out


def default_model_dir(
    cache: Path | None = None, *, progress: bool = True, download: bool = True, weight_dtype: str = DEFAULT_WEIGHTS,
    precision: str = DEFAULT_PRECISION,
) -> Path:
    """The default model (:data:`sf_trt.models.DEFAULT_MODEL`) fetched and exported
    into the cache (built once, then reused); ``weight_dtype`` and ``precision`` as for
    :func:`export_model_dir`. A cached export that is intact is used without
    reading the GGUF; a damaged one is rebuilt from the GGUF, which is checked
    against its pinned digest first (and fetched again if it does not match)."""
    with cache_lock(cache):  # replicas sharing the cache fetch and export once (docs/deploy.md)
        return _default_model_dir(cache, progress, download, weight_dtype, precision)


def _default_model_dir(cache: Path | None, progress: bool, download: bool, weight_dtype: str, precision: str) -> Path:
    out = export_dir(DEFAULT_MODEL.gguf_name, weight_dtype, cache, precision)
    if os.environ.get("SF_TRT_GGUF") is None:
        sweep_stale(out)
        try:
            found = ModelDir.open(out)
            if found.gguf_sha256 == DEFAULT_MODEL.sha256 and found.weights == weight_dtype and found.precision == precision:
                return out
        except ModelDirError:
            pass
        check_out_dir(out)  # writable, before anything is fetched
    gguf = default_gguf_path(cache, progress=progress, download=download)
    known = DEFAULT_MODEL.sha256 if os.environ.get("SF_TRT_GGUF") is None else None
    return export_model_dir(
        gguf, export_dir(gguf, weight_dtype, cache, precision), progress=progress, weight_dtype=weight_dtype,
        precision=precision, gguf_sha256=known,
    )


def _say(msg: str) -> None:
    import sys

    print(f"sf_trt: {msg}", file=sys.stderr, flush=True)


def write_model_dir(
    out_dir: str | os.PathLike,
    cfg: LlamaConfig,
    model: onnx.ModelProto | Callable[[Path], onnx.ModelProto],
    tokenizer: Any = None,
    source: dict[str, Any] | None = None,
    weight_dtype: str = "float32",
    *,
    force: bool = False,
) -> Path:
    """Write a model directory: the decoder ``model`` (slots form, weights as
    external data), its pass form, the verify graph, ``config.json`` and, when
    given, the tokenizer files. ``source`` is recorded as ``config.json["gguf"]``,
    the decoder's precision (its metadata) as ``config.json["precision"]``, and the
    sha256 of every file as ``config.json["sha256"]``.

    ``model`` may be a function of the weight file's path that builds the graph writing its
    weights there (``build_decoder_graph(..., external_data=path)``): the export then never
    holds the graph's weights in memory.

    Written into a temporary directory beside ``out_dir`` and renamed into
    place, so an interrupted write never leaves a half-written model behind;
    ``out_dir`` as :func:`check_out_dir` allows.
    """
    import onnx

    from sf_trt.graphs.verify import build_verify_graph

    from .decoder_graph import pass_form

    def fill(tmp: Path) -> None:
        graph = model(tmp / DATA_FILE) if callable(model) else model
        if "lane_ids" not in {i.name for i in graph.graph.input}:
            raise ValueError("write_model_dir: expected the slots form of the decoder graph (build_decoder_graph's default)")
        precision = graph_precision(graph)
        onnx.save_model(
            graph, str(tmp / GRAPH_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
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
            "graph": graph_facts(cfg, precision),
            "weights": weight_dtype,
            "precision": precision,
            "gguf": source or {},
            "files": files + [CONFIG_FILE],
            "sha256": {name: sha256_file(tmp / name) for name in files},
        }
        meta["config_sha256"] = config_digest(meta)
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    return _write_dir_atomically(check_out_dir(out_dir, force=force), fill)


def _write_dir_atomically(out: Path, fill: Callable[[Path], None]) -> Path:
    """Run ``fill`` on a temporary directory beside ``out``, then rename it over ``out``."""
    tmp = temp_path(out, "tmp")
    with removed_on_signal(tmp):
        tmp.mkdir()
        fill(tmp)
        umask = os.umask(0)
        os.umask(umask)
        for p in tmp.iterdir():  # onnx writes external data 0600: every file as the umask says
            os.chmod(p, 0o666 & ~umask)
        replace_dir(tmp, out)
    return out


def graph_facts(cfg: LlamaConfig, precision: str = DEFAULT_PRECISION) -> dict[str, Any]:
    """What ``config.json["graph"]`` records about the decoder graphs."""
    from sf_trt.graphs.builder import OPSET  # imports onnx: only when a model directory is written

    cache_type = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    return {
        "opset": OPSET,
        "graphs": {GRAPH_FILE: "slots", PASS_GRAPH_FILE: "pass"},
        "inputs": list(INPUTS) + ["past_key_{i}", "past_value_{i}"],
        "outputs": list(OUTPUTS),
        "cache_layout": f"[max_lanes (slots form) or batch (pass form), n_kv_heads, max_context + 1, head_dim] {cache_type}; position max_context is the trash slot",
        "new_kv_layout": f"[n_layers, 2 (key, value), batch, rows_per_lane, n_kv_heads, head_dim] {cache_type}",
        "padding_position": PADDING_POSITION,
        "rope": "interleaved pairs (GGUF q/k row order)",
        "max_positions": cfg.context_length,
        "dynamic_dims": ["batch", "rows_per_lane", "logit_rows", "max_lanes", "cache_len"],
    }
