"""The one ONNX graph builder: nodes and initializers with unique names.

Every graph sf_trt makes (the verify-and-sample graph, the copy model, export's
decoder) is written with :class:`GraphBuilder` and finished by
:meth:`GraphBuilder.model`, so they share one opset and one naming scheme::

    g = GraphBuilder()
    y = g.op("MatMul", ["x", g.init(w, "w")], "proj")   # output "proj_1"
    g.named("Relu", [y], "out")                          # output "out", as declared
    model = g.model("tiny", inputs, outputs, producer="sf_trt.example")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["OPSET", "IR_VERSION", "GraphBuilder"]

OPSET = 17
"""The ONNX opset of every graph sf_trt builds (TensorRT 10.0 imports up to 20)."""
IR_VERSION = 10
"""The highest ONNX IR version written: what onnxruntime 1.18 (our floor) reads."""


class GraphBuilder:
    """Nodes and initializers of one graph.

    ``init(value)`` adds a constant (equal constants are stored once) and returns
    its name; ``init(value, name)`` stores it under exactly ``name``.
    ``op(op_type, inputs, stem)`` adds a node whose outputs get fresh names from
    ``stem``; ``named(op_type, inputs, out)`` one whose single output is ``out``
    (a graph output, say).
    """

    def __init__(self, external: str | os.PathLike | None = None, threshold: int = 1024) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}
        self._names: set[str] = set()
        self.external = None if external is None else Path(external)
        """Where initializers of ``threshold`` bytes or more are written as they are added (ONNX
        external data, the file's name as their location): a graph's weights are then never all
        in memory at once. None: every initializer stays in the graph."""
        self.threshold = threshold

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def init(self, value: Any, name: str | None = None) -> str:
        arr = np.ascontiguousarray(value)
        if name is None:
            key = (arr.dtype.str, arr.shape, arr.tobytes())
            if key not in self._consts:
                self._consts[key] = self.init(arr, self.fresh("c"))
            return self._consts[key]
        if name in self._names:
            raise ValueError(f"GraphBuilder.init: {name!r} is already a tensor of this graph")
        self._names.add(name)
        if self.external is not None and arr.nbytes >= self.threshold:
            self.inits.append(self._written(arr, name))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def _written(self, arr: np.ndarray, name: str) -> onnx.TensorProto:
        """``arr`` appended to :attr:`external`, as a tensor that refers to its bytes there."""
        tensor = onnx.TensorProto(name=name, dims=arr.shape, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype))
        with open(self.external, "ab") as f:
            offset = f.tell()
            f.write(memoryview(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))).cast("B"))  # no copy of the bytes
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.external.name), ("offset", str(offset)), ("length", str(arr.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    def i64(self, value: Any, name: str | None = None) -> str:
        return self.init(np.asarray(value, dtype=np.int64), name)

    def f32(self, value: Any, name: str | None = None) -> str:
        return self.init(np.asarray(value, dtype=np.float32), name)

    def op(self, op_type: str, inputs: list[str], stem: str | None = None, n_out: int = 1, **attrs: Any):
        outs = [self.fresh(stem or op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs

    def named(self, op_type: str, inputs: list[str], out: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def model(
        self,
        name: str,
        inputs: Iterable[onnx.ValueInfoProto],
        outputs: Iterable[onnx.ValueInfoProto],
        *,
        producer: str,
        metadata: dict[str, str] | None = None,
    ) -> onnx.ModelProto:
        """The finished model at :data:`OPSET`, ``metadata`` in its ``metadata_props``."""
        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), self.inits)
        opsets = [helper.make_opsetid("", OPSET)]
        opsets += [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in self.nodes} - {"", "ai.onnx"})]  # contrib ops (onnxruntime's)
        model = helper.make_model(graph, opset_imports=opsets, producer_name=producer)
        model.ir_version = min(model.ir_version, IR_VERSION)
        for key, value in (metadata or {}).items():
            model.metadata_props.add(key=key, value=str(value))
        return model
