"""The entry points: open a model once and run requests on it from Python
(:class:`~sf_trt.entrypoints.llm.LLM`, :class:`~sf_trt.entrypoints.model.ModelSpec`),
and build a server from one :class:`~sf_trt.entrypoints.serving.ServeConfig`.

A layer of its own, above the runtime and the build steps (opening a GGUF exports
it on first use) and below the command line, which opens models through it.
"""

from .llm import LLM
from .model import CONTEXT_STEP, DEFAULT_CONTEXT, ModelSpec, OpenedModel, resolve
from .serving import ServeConfig

__all__ = ["LLM", "ModelSpec", "OpenedModel", "resolve", "ServeConfig", "DEFAULT_CONTEXT", "CONTEXT_STEP"]
