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
import os
import sys

from sf_trt.formats.model_dir import ModelDir
from sf_trt.tokenizer import Tokenizer, TokenizerError

from .errors import CliError
from .flags import CONTEXT_STEP, DEFAULT_CONTEXT

__all__ = ["Resolved", "resolve", "open_backend", "context_window", "cores", "note"]


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A model directory ready to run, and its tokenizer."""

    model_dir: ModelDir
    tokenizer: Tokenizer


def note(msg: str) -> None:
    """A note for the user: stderr, never stdout (which carries only the answer)."""
    print(f"sf-trt: {msg}", file=sys.stderr, flush=True)


def resolve(args: argparse.Namespace, *, progress: bool = True) -> Resolved:
    """The model the flags name: ``--model DIR`` as it is (its files checked
    against their digests), ``--gguf PATH``, ``--hf DIR`` or the default model exported
    into the cache on first use (progress on stderr; the cache checked writable
    before anything is fetched or built)."""
    from sf_trt import models
    from sf_trt.export.pipeline import default_model_dir, export_model_dir

    if args.model is not None:
        model_dir = ModelDir.open(args.model)
    else:
        source = models.check_source(gguf=args.gguf, hf=getattr(args, "hf", None))
        if source is not None:
            with models.cache_lock():  # processes sharing the cache export it once
                path = export_model_dir(source, models.export_dir(source, args.weights), progress=progress, weight_dtype=args.weights)
        else:
            path = default_model_dir(progress=progress, weight_dtype=args.weights)
        model_dir = ModelDir.open(path, verify=False)  # checked (or written) just now
    try:
        tokenizer = Tokenizer.load(model_dir.path)
    except TokenizerError as exc:
        raise TokenizerError(f"{exc} (re-export the model with `sf-trt export`)") from None
    return Resolved(model_dir, tokenizer)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def open_backend(args: argparse.Namespace, model: Resolved, *, max_lanes: int, max_context: int):
    """The ``--backend`` the flags name, opened on ``model`` (``--threads`` capped
    to the cores here, with a note)."""
    from sf_trt.backends import open_model

    threads = args.threads
    if threads is not None and threads > cores():
        note(f"--threads {threads} capped to the {cores()} cores here")
        threads = cores()
    return open_model(
        args.backend, model.model_dir.path, max_lanes=max_lanes, max_context=max_context,
        threads=threads, engines=args.engines, spinning=getattr(args, "spin", False),
    )


def context_window(flag: int | None, model_context: int, requests: list[tuple[str, int, int]]) -> int:
    """The positions per lane: ``--max-context`` (``flag``) when given, else the
    tightest multiple of CONTEXT_STEP that holds every request's prompt plus its
    output, capped at the model's context. ``requests``: ``(what, prompt tokens,
    max tokens (0: unbounded))``. A request whose prompt leaves no room to
    generate is refused naming its numbers; one whose output would run past the
    window stops there (finish ``context``)."""
    if flag is not None and flag > model_context:
        raise CliError(f"--max-context {flag} exceeds the model's context of {model_context}")
    limit, named = (flag, f"--max-context {flag}") if flag is not None else (model_context, f"the model's context of {model_context}")
    for what, prompt_len, _ in requests:
        if prompt_len >= limit:
            raise CliError(f"{what}: {prompt_len} tokens leave no room in {named}")
    if flag is not None:
        return flag
    need = max((n + (m or DEFAULT_CONTEXT) for _, n, m in requests), default=DEFAULT_CONTEXT)
    return min(model_context, max(CONTEXT_STEP, -(-need // CONTEXT_STEP) * CONTEXT_STEP))
