"""The entry points: open a model once and run requests on it from Python
(:class:`~sf_trt.entrypoints.llm.LLM`, :class:`~sf_trt.entrypoints.model.ModelSpec`).

A layer of its own, above the runtime and the build steps (opening a GGUF exports
it on first use) and below the command line, which opens models through it.
"""

from .llm import LLM
from .model import CONTEXT_STEP, DEFAULT_CONTEXT, ModelSpec, OpenedModel, resolve

__all__ = ["LLM", "ModelSpec", "OpenedModel", "resolve", "DEFAULT_CONTEXT", "CONTEXT_STEP"]
