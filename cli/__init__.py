"""``sf-trt``: generate, bench, export and build from the command line.

    sf-trt generate --chat "Rewrite this function with type hints: ..."
    sf-trt export [--gguf PATH | --hf DIR] [--out DIR]
    sf-trt inspect PATH                 (what a GGUF or checkpoint holds; whether it is supported)
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
from .inspect import add_inspect_parser
from .serve import add_serve_parsers

__all__ = ["main", "build_parser", "CliError"]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sf-trt", description="Exact speculative decoding on ONNX Runtime and TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_parser(sub)
    add_export_parser(sub)
    add_inspect_parser(sub)
    add_bench_parser(sub)
    add_build_parser(sub)
    add_serve_parsers(sub)  # serve, loadtest
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    from sf_trt.export.gguf_llama import GGUFError
    from sf_trt.export.hf_checkpoint import HFError
    from sf_trt.formats.files import NotWritable, Terminated
    from sf_trt.formats.model_dir import ModelDirError
    from sf_trt.models import ModelError
    from sf_trt.tokenizer import TokenizerError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StatusError as exc:
        _say(f"{exc} [{exc.status.name}]")
    except (CliError, ModelError, ModelDirError, GGUFError, HFError, TokenizerError, NotWritable) as exc:
        _say(str(exc))
    except Terminated as exc:
        _say(f"{exc}; unfinished files removed")
        return exc.code
    except MemoryError:
        _say(f"out of memory in `sf-trt {args.command}`: the model or the request asks for more than this process "
             "can have (a damaged model file can ask for any amount)")
    except KeyboardInterrupt:
        print(file=sys.stderr)
        _say("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    return 1


def _say(message: str) -> None:
    """A refusal: one line on stderr (a message spanning lines is joined)."""
    print("sf-trt: " + " ".join(message.split("\n")), file=sys.stderr)
