"""The fake model (SPEC.md's ``sf_trt.fake``): :class:`FakeConfig` and :class:`FakePrimitives`.

It is a backend like the others and lives among them (:mod:`sf_trt.backends.fake`);
this module keeps the name SPEC.md pins.
"""

from .backends.fake import FakeConfig, FakePrimitives

__all__ = ["FakeConfig", "FakePrimitives"]
