"""From the command line's model flags to an open model, resolved once and handed on.

:func:`resolve` turns ``--model`` / ``--gguf`` / nothing (the default model)
into a checked :class:`~sf_trt.formats.model_dir.ModelDir` and its tokenizer,
exporting on first use; :func:`open_backend` opens the backend the flags name on
it. Every command that runs a model goes through both, so a model is found,
hashed and loaded once per command.
"""

from __future__ import annotations

import argparse
import dataclasses

from sf_trt.formats.model_dir import ModelDir
from sf_trt.tokenizer import Tokenizer, TokenizerError

from .flags import CONTEXT_STEP, DEFAULT_CONTEXT

__all__ = ["Resolved", "resolve", "open_backend", "context_for"]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A model directory ready to run, and its tokenizer."""

    model_dir: ModelDir
    tokenizer: Tokenizer


def resolve(args: argparse.Namespace, *, progress: bool = True) -> Resolved:
    """The model the flags name: ``--model DIR`` as it is, ``--gguf PATH`` or the
    default model exported into the cache on first use (progress on stderr)."""
    from sf_trt import models
    from sf_trt.export.gguf_llama import check_gguf_file
    from sf_trt.export.pipeline import default_model_dir, export_model_dir

    if args.model is not None:
        path = args.model
    elif args.gguf is not None:
        gguf = models.check_gguf(args.gguf)
        check_gguf_file(gguf)
        path = export_model_dir(gguf, models.export_dir(gguf, args.weights), progress=progress, weight_dtype=args.weights)
    else:
        path = default_model_dir(progress=progress, weight_dtype=args.weights)
    model_dir = ModelDir.open(path)
    try:
        tokenizer = Tokenizer.load(model_dir.path)
    except TokenizerError as exc:
        raise TokenizerError(f"{exc} (re-export the model with `sf-trt export`)") from None
    return Resolved(model_dir, tokenizer)


def open_backend(args: argparse.Namespace, model: Resolved, *, max_lanes: int, max_context: int):
    """The ``--backend`` the flags name, opened on ``model``."""
    from sf_trt.backends import open_model

    return open_model(
        args.backend, model.model_dir.path, max_lanes=max_lanes, max_context=max_context,
        threads=args.threads, engines=args.engines,
    )


def context_for(max_context: int | None, needs: list[int]) -> int:
    """``max_context`` (the flag), or the tightest window (a multiple of
    CONTEXT_STEP) that holds every request's prompt plus output (``needs``; 0: unbounded)."""
    if max_context is not None:
        return max_context
    if not needs or 0 in needs:
        return DEFAULT_CONTEXT
    return max(CONTEXT_STEP, -(-max(needs) // CONTEXT_STEP) * CONTEXT_STEP)
