"""``sf-trt build``: check ONNX graphs against TensorRT's parser, build engines.

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
    from sf_trt.export.trt_config import PRECISIONS, BuildConfig
    from sf_trt.export.trt_support import DEFAULT_MAX_OPSET

    d = BuildConfig()
    p.add_argument("paths", nargs="*", metavar="DIR|ONNX", help="ONNX files, or directories of *.onnx files")
    p.add_argument("--check", action="store_true", help="only check the graphs against TensorRT's ONNX parser support")
    p.add_argument("--registry", action="store_true", help="also take every graph sf_trt builds (sf_trt.export.registry.GRAPHS)")
    p.add_argument("--out", default="engines", help="engine directory (default: engines/)")
    p.add_argument("--precision", choices=PRECISIONS, default=d.precision, help=f"default: {d.precision} (the verify graph is always fp32)")
    p.add_argument("--workspace", type=_bytes, default=d.workspace_bytes, help="workspace memory-pool limit (default: 1G)")
    p.add_argument("--timing-cache", default=None, help="timing cache file, read if present and written after the build")
    p.add_argument("--max-rows", type=_positive, default=d.max_rows_per_pass, help=f"rows per pass (default: {d.max_rows_per_pass})")
    p.add_argument("--max-lanes", type=_positive, default=d.max_lanes, help=f"lanes (default: {d.max_lanes})")
    p.add_argument("--max-context", type=_positive, default=d.max_context, help=f"context length (default: {d.max_context})")
    p.add_argument("--opt-rows", type=_positive, default=None, help="rows the kernels are tuned for (default: --max-lanes)")
    p.add_argument("--opt-lanes", type=_positive, default=None)
    p.add_argument("--opt-context", type=_positive, default=None)
    p.add_argument("--max-opset", type=_positive, default=DEFAULT_MAX_OPSET, help=f"highest opset the target TensorRT imports (default: {DEFAULT_MAX_OPSET}, TensorRT 10.0)")
    p.add_argument("--plugin", action="append", default=[], metavar="OP_TYPE", help="an op type a TensorRT plugin provides (repeatable)")
    p.add_argument("--verbose", "-v", action="store_true", help="also print warnings")


def _collect(paths: Sequence[str]) -> tuple[list[Path], list[str]]:
    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
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


def run_build(args: argparse.Namespace, *, out=None, err=None) -> int:
    """Run ``sf-trt build`` on parsed ``args``; returns the exit code."""
    out = out or (lambda s: print(s, file=sys.stdout))
    err = err or (lambda s: print(s, file=sys.stderr))
    files, problems = _collect(args.paths)
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


def _check_all(files: list[Path], args: argparse.Namespace, out, err) -> int:
    """The op check of every graph; EXIT_OK when all are supported."""
    from sf_trt.export.trt_support import check_file, errors_in, format_findings

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
        out(f"{path}: {'refused' if errors else 'ok'}{note}")
        if shown:
            out(format_findings(shown, indent="    "))
        refused += bool(errors)
    if refused:
        err(f"sf-trt build: {refused} of {len(files)} graph(s) use what TensorRT's ONNX parser does not support")
        return EXIT_REFUSED
    if args.check:
        out(f"all {len(files)} graph(s) supported by TensorRT's ONNX parser")
    return EXIT_OK


def _build_all(files: list[Path], args: argparse.Namespace, out, err) -> int:
    """Build every graph into ``args.out``; EXIT_OK when all were built."""
    from sf_trt.export.trt_build import build_engine
    from sf_trt.export.trt_config import BuildConfig, BuildError

    try:
        cfg = BuildConfig(
            precision=args.precision, workspace_bytes=args.workspace, timing_cache=args.timing_cache,
            max_rows_per_pass=args.max_rows, max_lanes=args.max_lanes, max_context=args.max_context,
            opt_rows_per_pass=args.opt_rows, opt_lanes=args.opt_lanes, opt_context=args.opt_context,
        )
    except BuildError as exc:
        err(f"sf-trt build: error: {exc}")
        return EXIT_USAGE
    failed = 0
    for path in files:
        try:
            build_engine(path, cfg, args.out, plugins=args.plugin, max_opset=args.max_opset, log=out)
        except BuildError as exc:
            err(f"sf-trt build: {path}: {exc}")
            failed += 1
            if str(exc).startswith("TensorRT not available"):
                return EXIT_REFUSED  # every other graph would fail the same way
        except OSError as exc:
            err(f"sf-trt build: {path}: {type(exc).__name__}: {exc}")
            failed += 1
    if failed:
        return EXIT_REFUSED
    out(f"built {len(files)} engine(s) into {args.out}/ (manifest: {Path(args.out) / 'manifest.json'})")
    return EXIT_OK
