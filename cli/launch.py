"""From the command line's model flags to an open model, resolved once and handed on.

:func:`model_spec` and :func:`backend_spec` turn ``--model`` / ``--gguf`` / nothing
(the default model), ``--weights``, ``--backend``, ``--threads``, ``--engines`` and
``--spin`` into the entry points' specs (:class:`~sf_trt.entrypoints.model.ModelSpec`,
:class:`~sf_trt.backends.BackendSpec`); :func:`resolve` opens the model (exporting it
on first use) and :func:`open_backend` the backend on it. Every command that runs a
model goes through them, so a model is found, hashed and loaded once per command.
"""

from __future__ import annotations

import argparse
import os
import sys

from sf_trt.backends import BackendSpec
from sf_trt.formats.model_dir import AUTO_WEIGHTS, DEFAULT_WEIGHTS
from sf_trt.entrypoints.model import CONTEXT_STEP, DEFAULT_CONTEXT, ModelSpec, OpenedModel
from sf_trt.entrypoints.model import resolve as resolve_spec

from .errors import CliError

__all__ = ["model_spec", "backend_spec", "resolve", "open_backend", "context_window", "cores", "note"]


def note(msg: str) -> None:
    """A note for the user: stderr, never stdout (which carries only the answer)."""
    print(f"sf-trt: {msg}", file=sys.stderr, flush=True)


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model the flags name: ``--model DIR``, ``--gguf PATH``, ``--hf DIR`` or the default model, with ``--weights``
    (``auto`` is int8 off onnxruntime's CPU path: 4-bit blocks run there only)."""
    weights = args.weights
    if weights == AUTO_WEIGHTS and getattr(args, "backend", "onnxruntime") != "onnxruntime":
        weights = DEFAULT_WEIGHTS
    return ModelSpec(path=args.model, gguf=args.gguf, hf=getattr(args, "hf", None), weights=weights)


def backend_spec(args: argparse.Namespace) -> BackendSpec:
    """The backend the flags name (``--threads`` capped to the cores here, with a note)."""
    threads = args.threads
    if threads is not None and threads > cores():
        note(f"--threads {threads} capped to the {cores()} cores here")
        threads = cores()
    return BackendSpec(args.backend, threads, args.engines, getattr(args, "spin", False))


def resolve(args: argparse.Namespace, *, progress: bool = True) -> OpenedModel:
    """The model the flags name, opened (:func:`sf_trt.entrypoints.model.resolve`: a model
    directory checked against its digests, a GGUF, a checkpoint or the default model exported into
    the cache on first use, progress on stderr)."""
    return resolve_spec(model_spec(args), progress=progress)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def open_backend(args: argparse.Namespace, model: OpenedModel, *, max_lanes: int, max_context: int):
    """The ``--backend`` the flags name, opened on ``model``."""
    return backend_spec(args).open(model.model_dir.path, max_lanes=max_lanes, max_context=max_context)


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
