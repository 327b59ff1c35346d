"""``sf-trt inspect PATH``: what a GGUF, a Hugging Face checkpoint or a model directory holds, and whether sf_trt supports it."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["add_inspect_parser"]


def add_inspect_parser(sub) -> None:
    p = sub.add_parser("inspect", help="say what a model file or directory holds and whether sf_trt supports it",
                       description="Read a GGUF's metadata and tensor table, a Hugging Face checkpoint's config.json and "
                       "safetensors headers, or a model directory's config.json (no weights are read) and say what it "
                       "holds: architecture, sizes, tensor types, context, chat template; and whether an export would "
                       "accept it, or the one-line reason it would not. Exit 0 when supported, 1 when not.")
    p.add_argument("path", type=Path, metavar="PATH", help="a .gguf file, a checkpoint directory or a model directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    from sf_trt.export.inspect import describe, render

    facts = describe(args.path)
    print(json.dumps(facts) if args.json else render(facts))
    return 0 if facts["supported"] else 1
