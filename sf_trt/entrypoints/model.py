"""What model to open (:class:`ModelSpec`), and opening it once (:func:`resolve`).

A model is one of: the default model (SmolLM2-135M-Instruct, fetched and exported
into the cache on first use), a GGUF or a Hugging Face checkpoint directory of a
supported family (docs/models.md; exported into the cache on first use, then reused),
or a model directory written by ``sf-trt export`` (its files checked against their
digests). The command line, the server, Ray replicas, ``sf_trt.LLM`` and the tools all
open a model this way.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Optional, Union

from ..abi import Status, StatusError
from ..formats.model_dir import AUTO_WEIGHTS, WEIGHT_CHOICES, ModelDir
from ..tokenizer import Tokenizer, TokenizerError

__all__ = ["ModelSpec", "OpenedModel", "resolve", "DEFAULT_CONTEXT", "CONTEXT_STEP"]

DEFAULT_CONTEXT = 2048
"""Positions per lane when nothing says otherwise (capped at the model's context)."""
CONTEXT_STEP = 256
"""A context window chosen to fit requests is a multiple of this."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What model to open: ``path`` (a model directory), ``gguf`` (a GGUF file), ``hf`` (a
    Hugging Face checkpoint directory), or none of them (the default model); ``weights``:
    the weight dtype a GGUF, a checkpoint or the default model is exported with (one of
    :data:`~sf_trt.formats.model_dir.WEIGHT_DTYPES`, or ``auto``: chosen per source by
    :func:`sf_trt.export.pipeline.auto_weights`; a model directory has its own). Refusals are
    StatusError ``BAD_ARGUMENT``."""

    path: Optional[Path] = None
    gguf: Optional[Path] = None
    hf: Optional[Path] = None
    weights: str = AUTO_WEIGHTS

    def __post_init__(self) -> None:
        for name in ("path", "gguf", "hf"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise StatusError(Status.BAD_ARGUMENT, f"ModelSpec: {name} must be a path (got {type(value).__name__})")
            if value is not None:
                object.__setattr__(self, name, Path(value).expanduser())
        given = [f"{name} {getattr(self, name)}" for name in ("path", "gguf", "hf") if getattr(self, name) is not None]
        if len(given) > 1:
            raise StatusError(Status.BAD_ARGUMENT, f"ModelSpec: one of a model directory, a GGUF or a checkpoint, not more (got {' and '.join(given)})")
        if self.weights not in WEIGHT_CHOICES:
            raise StatusError(Status.BAD_ARGUMENT, f"ModelSpec: weights {self.weights!r} unknown (known: {', '.join(WEIGHT_CHOICES)})")

    @classmethod
    def of(cls, model: Union[str, os.PathLike, "ModelSpec", None], *, weights: str = AUTO_WEIGHTS) -> "ModelSpec":
        """The spec ``model`` names: a spec as it is, None for the default model, a
        directory holding ``*.safetensors`` for a Hugging Face checkpoint, another
        directory for a model directory, anything else for a GGUF file."""
        if isinstance(model, ModelSpec):
            return model
        if model is None:
            return cls(weights=weights)
        if not isinstance(model, (str, os.PathLike)):
            raise StatusError(Status.BAD_ARGUMENT, f"model must be a path, a ModelSpec or None (got {type(model).__name__})")
        path = Path(model).expanduser()
        if path.is_dir():
            is_checkpoint = next(path.glob("*.safetensors"), None) is not None
            return cls(hf=path, weights=weights) if is_checkpoint else cls(path=path, weights=weights)
        return cls(gguf=path, weights=weights)

    @property
    def name(self) -> str:
        """The model's name: the directory's, the GGUF's without ``.gguf``, the checkpoint
        directory's, or the default model's."""
        if self.path is not None:
            return self.path.name
        if self.hf is not None:
            return self.hf.resolve().name
        if self.gguf is not None:
            return self.gguf.name.removesuffix(".gguf")
        from .. import models

        return models.DEFAULT_MODEL.model_name


@dataclasses.dataclass(frozen=True)
class OpenedModel:
    """A model directory ready to run, and its tokenizer."""

    model_dir: ModelDir
    tokenizer: Tokenizer

    def context(self, asked: Optional[int] = None) -> int:
        """Positions per lane: ``asked`` (at most the model's context), else
        :data:`DEFAULT_CONTEXT` capped at the model's context."""
        limit = self.model_dir.max_positions
        if asked is None:
            return min(DEFAULT_CONTEXT, limit)
        if isinstance(asked, bool) or not isinstance(asked, int) or not 2 <= asked <= limit:
            raise StatusError(Status.BAD_ARGUMENT, f"max_context must be an int in 2..{limit} (the model's context; got {asked!r})")
        return asked


def resolve(spec: ModelSpec, *, progress: bool = False) -> OpenedModel:
    """Open the model ``spec`` names: a model directory as it is (its files checked
    against their digests), a GGUF, a checkpoint or the default model exported into the
    cache on first use (``progress`` on stderr; the cache checked writable before anything is
    fetched or built). Raises ModelError, ModelDirError, GGUFError or TokenizerError
    with a one-line message naming the path and what was expected."""
    from .. import models
    from ..export.pipeline import auto_weights, default_model_dir, export_model_dir

    if spec.path is not None:
        model_dir = ModelDir.open(spec.path)
    else:
        source = models.check_source(gguf=spec.gguf, hf=spec.hf)
        weights = spec.weights
        if weights == AUTO_WEIGHTS:
            weights, why = auto_weights(source)
            if progress and source is not None:
                print(f"sf_trt: --weights auto: {weights} ({why})", file=sys.stderr, flush=True)
        if source is not None:
            with models.cache_lock():  # processes sharing the cache export it once
                path = export_model_dir(source, models.export_dir(source, weights), progress=progress, weight_dtype=weights)
        else:
            path = default_model_dir(progress=progress, weight_dtype=weights)
        model_dir = ModelDir.open(path, verify=False)  # checked (or written) just now
    try:
        tokenizer = Tokenizer.load(model_dir.path)
    except TokenizerError as exc:
        raise TokenizerError(f"{exc} (re-export the model with `sf-trt export`)") from None
    return OpenedModel(model_dir, tokenizer)
