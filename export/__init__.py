"""Build steps: ONNX graphs from specs, TensorRT engines from graphs, saved with manifests.

Each step is a small function; nothing here runs a model (that is ``sf_trt``'s job).
"""
