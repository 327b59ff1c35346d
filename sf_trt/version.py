"""sf_trt's version (``sf_trt.__version__``), in a module of its own so that any layer may read it."""

__version__ = "0.1.0"
