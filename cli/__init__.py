"""``sf-trt``: generate, bench, export and build from the command line.

    sf-trt generate --chat "Rewrite this function with type hints: ..."
    sf-trt export [--gguf PATH] [--out DIR]
    sf-trt bench --prompts tools/prompts/bench.jsonl [--lanes N] [--json]
    sf-trt build --check DIR            (TensorRT's op support, no TensorRT needed)

The command line sits above the runtime (``sf_trt``) and the build steps
(``sf_trt.export``), and is the one layer that uses both. Bad input (a missing
or truncated GGUF, an unsupported architecture, an empty or too long prompt, an
out-of-range flag) gets a one-line message and a nonzero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from sf_trt.abi import StatusError

from .bench import add_bench_parser
from .build import add_build_parser
from .errors import CliError
from .export import add_export_parser
from .generate import add_generate_parser

__all__ = ["main", "build_parser", "CliError"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sf-trt", description="Exact speculative decoding on ONNX Runtime and TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_parser(sub)
    add_export_parser(sub)
    add_bench_parser(sub)
    add_build_parser(sub)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    from sf_trt.export.gguf_llama import GGUFError
    from sf_trt.formats.model_dir import ModelDirError
    from sf_trt.models import ModelError
    from sf_trt.tokenizer import TokenizerError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StatusError as exc:
        print(f"sf-trt: {exc} [{exc.status.name}]", file=sys.stderr)
    except (CliError, ModelError, ModelDirError, GGUFError, TokenizerError) as exc:
        print(f"sf-trt: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nsf-trt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 1
