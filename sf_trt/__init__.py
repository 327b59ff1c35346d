"""sf_trt: exact speculative decoding on ONNX Runtime and TensorRT.

Importing the package needs neither a GPU nor TensorRT: backends import their
heavy dependencies lazily.
"""

from .abi import CertMode, Exactness, Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError

__version__ = "0.1.0"
__all__ = ["CertMode", "Exactness", "Finish", "Sampling", "SamplingFlag", "SamplingParams", "Status", "StatusError"]
