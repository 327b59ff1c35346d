"""``sf-trt build``: check ONNX graphs against TensorRT's parser, build engines.

Every engine takes one shape (``--max-lanes``, ``--rows-per-lane``, ``--max-context``);
``--check`` lists it per graph with the op check. A model directory stands for its
``decoder.onnx`` and ``verify.onnx`` (the engines the TensorRT backend opens); its
pass form (``decoder_pass.onnx``) is onnxruntime's, named as such and not checked.
Precision is the graph's own (``sf-trt export --precision``).

Exit codes: 0 all graphs supported (and built); 1 a graph is refused or a build
failed (the offending nodes are listed); 2 bad command line or unreadable input.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Sequence

__all__ = ["add_build_parser", "run_build"]

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def _bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 1073741824, 512M, 4G)")
    return int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def add_build_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``build`` subcommand to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "build",
        help="check ONNX graphs against TensorRT's parser and build TensorRT engines",
        description="Check ONNX graphs against what TensorRT's ONNX parser supports, then build each into "
        "a TensorRT engine under --out with a manifest.json. With --check, only check (no TensorRT needed).",
    )
    _add_arguments(p)
    p.set_defaults(func=run_build)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from sf_trt.export.trt_config import DEFAULT_MAX_OPSET, BuildConfig

    d = BuildConfig()
    p.add_argument("paths", nargs="*", metavar="DIR|ONNX",
                   help="ONNX files, directories of *.onnx files, or model directories (their decoder.onnx and verify.onnx)")
    p.add_argument("--check", action="store_true",
                   help="only check the graphs against TensorRT's ONNX parser support and list each engine's shapes")
    p.add_argument("--registry", action="store_true", help="also take every graph sf_trt builds (sf_trt.export.registry.GRAPHS)")
    p.add_argument("--out", default="engines", help="engine directory (default: engines/)")
    p.add_argument("--workspace", type=_bytes, default=d.workspace_bytes, help="workspace memory-pool limit (default: 1G)")
    p.add_argument("--timing-cache", default=None, help="timing cache file, read if present and written after the build")
    p.add_argument("--max-lanes", type=_positive, default=d.max_lanes,
                   help=f"lanes in every pass, and the cache's lane slots (default: {d.max_lanes})")
    p.add_argument("--rows-per-lane", type=_positive, default=d.rows_per_lane,
                   help=f"a decoder's rows of each lane in a pass: a decode step uses 1, a verify pass 1 + the draft; "
                   f"more run as several passes (default: {d.rows_per_lane}); the verify graph takes lanes x rows rows")
    p.add_argument("--max-context", type=_positive, default=d.max_context, help=f"positions per lane (default: {d.max_context})")
    p.add_argument("--max-opset", type=_positive, default=DEFAULT_MAX_OPSET, help=f"highest opset the target TensorRT imports (default: {DEFAULT_MAX_OPSET}, TensorRT 10.0)")
    p.add_argument("--plugin", action="append", default=[], metavar="OP_TYPE", help="an op type a TensorRT plugin provides (repeatable)")
    p.add_argument("--verbose", "-v", action="store_true", help="also print warnings")


def _collect(paths: Sequence[str], out=None) -> tuple[list[Path], list[str]]:
    from sf_trt.formats.model_dir import CONFIG_FILE, GRAPH_FILE, VERIFY_FILE, made_by_export

    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and (p / CONFIG_FILE).is_file() and made_by_export(p):
            files.extend(p / name for name in (GRAPH_FILE, VERIFY_FILE))  # the engines the TensorRT backend opens
            if out is not None:
                out(_pass_form_note(p))
        elif p.is_dir():
            found = sorted(p.glob("*.onnx"))
            if not found:
                problems.append(f"{raw}: directory holds no *.onnx files")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            problems.append(f"{raw}: no such file or directory")
    return files, problems


def _registry_files(dest: Path, err) -> list[Path]:
    import onnx

    from sf_trt.export.registry import GRAPHS

    files = []
    for name, make in GRAPHS.items():
        try:
            model = make()
        except ImportError as exc:
            err(f"registry graph {name!r} skipped: its builder is not importable ({exc})")
            continue
        path = dest / f"{name}.onnx"
        onnx.save(model, os.fspath(path))
        files.append(path)
    return files


def _pass_form_note(model_dir: Path) -> str:
    """Which decoder graph of a model directory each backend gets."""
    from sf_trt.formats.model_dir import GRAPH_FILE, PASS_GRAPH_FILE
    from sf_trt.graphs.ort_fusions import FUSED_OPS

    return (f"{model_dir / PASS_GRAPH_FILE}: onnxruntime's decoder (its CPU backend loads it, as {GRAPH_FILE}, in its contrib "
            f"ops {', '.join(FUSED_OPS)} and its attention as ONNX Attention), not a TensorRT engine; TensorRT builds {model_dir / GRAPH_FILE}")


def run_build(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run ``sf-trt build`` on parsed ``args``; returns the exit code."""
    out = out or (lambda s: print(s, file=sys.stdout))
    err = err or (lambda s: print(s, file=sys.stderr))
    files, problems = _collect(args.paths, out)
    for p in problems:
        err(f"sf-trt build: error: {p}")
    if problems:
        return EXIT_USAGE
    with tempfile.TemporaryDirectory(prefix="sf_trt_registry_") as tmp:
        if args.registry:
            reg_dir = Path(tmp) if args.check else Path(args.out) / "onnx"
            reg_dir.mkdir(parents=True, exist_ok=True)
            files += _registry_files(reg_dir, err)
        if not files:
            err("sf-trt build: error: no graphs given (pass ONNX files, directories, or --registry)")
            return EXIT_USAGE
        code = _check_all(files, args, out, err)  # everything, before anything is built
        if code != EXIT_OK or args.check:
            return code
        return _build_all(files, args, out, err)


def _config(args: argparse.Namespace):
    from sf_trt.export.trt_config import BuildConfig

    return BuildConfig(
        workspace_bytes=args.workspace, timing_cache=args.timing_cache,
        max_lanes=args.max_lanes, rows_per_lane=args.rows_per_lane, max_context=args.max_context,
    )


def _check_all(files: list[Path], args: argparse.Namespace, out, err) -> int:
    """The op check of every graph, and the shape of its engine; EXIT_OK when all are supported."""
    from sf_trt.export.trt_build import graph_to_build
    from sf_trt.export.trt_config import BuildError
    from sf_trt.export.trt_support import check_file, errors_in, format_findings

    cfg = _config(args)
    refused = 0
    for path in files:
        try:
            found = check_file(path, max_opset=args.max_opset, plugins=args.plugin)
        except Exception as exc:  # a graph malformed in a way onnx itself trips on
            err(f"sf-trt build: error: {path}: cannot check it ({type(exc).__name__}: {exc})")
            return EXIT_USAGE
        errors = errors_in(found)
        if any(f.node == "<file>" for f in errors):
            err(f"sf-trt build: error: {errors[0].problem}")
            return EXIT_USAGE
        shown = found if args.verbose else errors
        note = f" ({len(errors)} unsupported)" if errors else ""
        shapes = ""
        if not errors:
            try:
                graph = graph_to_build(path, cfg, plugins=args.plugin, max_opset=args.max_opset)
            except BuildError as exc:
                errors, note = [exc], f" ({str(exc).split(': ', 1)[-1]})"
            else:
                shapes = _describe_shapes(graph)
        out(f"{path}: {'refused' if errors else 'ok'}{note}")
        if shown:
            out(format_findings(shown, indent="    "))
        if shapes:
            out(shapes)
        refused += bool(errors)
    if refused:
        err(f"sf-trt build: {refused} of {len(files)} graph(s) refused: what TensorRT's ONNX parser does not support, or a shape a graph does not take (listed above)")
        return EXIT_REFUSED
    if args.check:
        out(f"all {len(files)} graph(s) supported by TensorRT's ONNX parser")
    return EXIT_OK


def _describe_shapes(graph) -> str:
    """The engine's one shape: ``kind, precision: dim=size ...``, then each distinct
    (mode, dtype, shape) of its I/O with the tensors that have it."""
    p = graph.profile
    sizes = {**{k: v[2] for k, v in p.dims.items()}}
    lines = [f"    engine: {graph.kind}, {graph.precision}, one shape: " + (" ".join(f"{k}={v}" for k, v in sizes.items()) or "static")]
    groups: dict[tuple, list[str]] = {}
    for t in graph.io:
        shape = [sizes.get(d, d) if isinstance(d, str) else d for d in t.shape]
        groups.setdefault((t.mode, t.dtype, tuple(shape)), []).append(t.name)
    for (mode, dtype, shape), names in groups.items():
        shown = ", ".join(names) if len(names) <= 3 else f"{names[0]}, {names[1]}, ... ({len(names)} tensors)"
        lines.append(f"      {mode:6} {dtype:8} {str(list(shape)):24} {shown}")
    return "\n".join(lines)


def _build_all(files: list[Path], args: argparse.Namespace, out, err) -> int:
    """Build every graph into ``args.out``; EXIT_OK when all were built."""
    from sf_trt.backends.tensorrt.errors import TensorRTUnavailable
    from sf_trt.backends.tensorrt.probes import device_info, import_tensorrt
    from sf_trt.export.trt_build import build_engine
    from sf_trt.export.trt_config import BuildError
    from sf_trt.formats.manifest import ManifestError

    cfg = _config(args)
    try:
        import_tensorrt()
        device_info()
    except TensorRTUnavailable as exc:  # every graph would fail the same way
        err(f"sf-trt build: {exc}")
        return EXIT_REFUSED
    failed = 0
    for path in files:
        try:
            build_engine(path, cfg, args.out, plugins=args.plugin, max_opset=args.max_opset, log=out)
        except BuildError as exc:
            err(f"sf-trt build: {path}: {exc}")
            failed += 1
        except (OSError, ManifestError) as exc:  # ManifestError: the --out manifest it would add to is damaged
            err(f"sf-trt build: {path}: {type(exc).__name__}: {exc}")
            failed += 1
    if failed:
        return EXIT_REFUSED
    out(f"built {len(files)} engine(s) into {args.out}/ (manifest: {Path(args.out) / 'manifest.json'})")
    return EXIT_OK
