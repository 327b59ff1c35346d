"""The backends behind the Primitives protocol, by name, imported only when created.

``BACKENDS`` maps a name to ``"module:Class"`` (or ``"module:Class.constructor"``,
a classmethod that opens the backend); :func:`create` imports the
module then (so ``import sf_trt.backends`` costs nothing and needs no GPU) and
refuses an unknown name by listing the known ones. Add a backend by adding an
entry (or calling :func:`register`).
"""

from __future__ import annotations

import importlib
from typing import Any

from ..abi import Status, StatusError

__all__ = ["BACKENDS", "create", "register", "names"]

BACKENDS: dict[str, str] = {
    "fake": "sf_trt.fake:FakePrimitives",
    "onnxruntime": "sf_trt.backends.ort_decoder:OrtDecoderPrimitives",
    "tensorrt": "sf_trt.backends.tensorrt:TensorRTPrimitives.open",
}


def names() -> list[str]:
    return sorted(BACKENDS)


def register(name: str, target: str) -> None:
    """Add backend ``name`` as ``"module:Class"``."""
    module, sep, cls = target.partition(":")
    if not (name and module and sep and cls):
        raise StatusError(Status.BAD_ARGUMENT, f"register({name!r}, {target!r}): expected a name and 'module:Class'")
    BACKENDS[name] = target


def create(name: str, **kw: Any):
    """A new instance of backend ``name``, constructed with ``kw``."""
    target = BACKENDS.get(name)
    if target is None:
        raise StatusError(Status.BAD_ARGUMENT, f"create({name!r}): unknown backend (known: {', '.join(names())})")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StatusError(Status.UNSUPPORTED, f"create({name!r}): {module_name} cannot be imported here ({exc})") from None
    factory: Any = module
    for part in cls_name.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise StatusError(Status.UNSUPPORTED, f"create({name!r}): {module_name} has no {cls_name}")
    return factory(**kw)
