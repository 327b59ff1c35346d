"""Rewrite a graph's integer arithmetic into float32, the way a backend that computes
integer ``Div``/``Mod`` (and, at worst, ``Mul``/``Add``/``Sub``) through float32 would.

``float32_integer_arithmetic(model, ops)`` returns a copy of ``model`` in which every node
whose op is in ``ops`` and whose inputs are INT32/INT64 is replaced by:

* ``Add``/``Sub``/``Mul``: cast both operands to float32, the op in float32, cast back;
* ``Div``: float32 divide, then truncate toward zero (the cast back; ONNX integer ``Div``
  truncates, and TensorRT's ONNX parser maps it to an element-wise ``kDIV``);
* ``Mod``: TensorRT's ONNX parser lowers it to ``a - b * FLOOR_DIV(a, b)`` (``fmod=0``) or
  ``a - b * DIV(a, b)`` (``fmod=1``); the rewrite computes the quotient as a float32 divide
  then floor (or truncate), and the product and difference in integers, or in float32
  too when ``Mul``/``Sub`` are among ``ops``. With integer product and difference this
  reproduces NVIDIA/TensorRT#4702 exactly (``18542495 % 32 == -1``).

Everything else is left as it is. Tests run the original and the rewrite on onnxruntime
side by side: a graph whose integer values all stay below 2**24 gives identical outputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.shape_inference
from onnx import TensorProto, helper, numpy_helper

INT_TYPES = (TensorProto.INT32, TensorProto.INT64)
DIV_MOD = frozenset({"Div", "Mod"})
ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Mod"})


def _types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.input) + list(g.output) + list(g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    return types


def integer_nodes(model: onnx.ModelProto, ops=ARITHMETIC) -> list[onnx.NodeProto]:
    """The nodes of ``model``'s main graph with an op in ``ops`` and integer inputs."""
    types = _types(model)
    return [n for n in model.graph.node if n.op_type in ops and types.get(n.input[0]) in INT_TYPES]


def float32_integer_arithmetic(model: onnx.ModelProto, ops=ARITHMETIC) -> onnx.ModelProto:
    """``model`` with its integer ``ops`` computed in float32 (module docstring)."""
    types = _types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        int_type = types.get(node.input[0]) if node.input else None
        if node.op_type not in ops or int_type not in INT_TYPES:
            nodes.append(node)
            continue
        stem = (node.name or node.output[0]) + "__f32"

        def f(op, inputs, suffix, **attrs):
            name = f"{stem}_{suffix}"
            nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
            return name

        a = f("Cast", [node.input[0]], "a", to=TensorProto.FLOAT)
        b = f("Cast", [node.input[1]], "b", to=TensorProto.FLOAT)
        if node.op_type in ("Add", "Sub", "Mul"):
            result = f(node.op_type, [a, b], "op")
        elif node.op_type == "Div":
            result = f("Div", [a, b], "div")  # the cast back truncates toward zero
        else:
            fmod = next((helper.get_attribute_value(x) for x in node.attribute if x.name == "fmod"), 0)
            q = f("Div", [a, b], "div")
            if fmod:
                q = f("Mul", [f("Sign", [q], "sign"), f("Floor", [f("Abs", [q], "abs")], "floor")], "trunc")
            else:
                q = f("Floor", [q], "floor")
            if {"Mul", "Sub"} <= set(ops):
                result = f("Sub", [a, f("Mul", [b, q], "bq")], "rem")
            else:  # the quotient rounded through float32, the rest exact
                qi = f("Cast", [q], "q_int", to=int_type)
                result = f("Sub", [node.input[0], f("Mul", [node.input[1], qi], "bq")], "rem", )
                nodes.append(helper.make_node("Identity", [result], list(node.output), name=stem + "_out"))
                continue
        nodes.append(helper.make_node("Cast", [result], list(node.output), name=stem + "_back", to=int_type))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def constant_ints(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Integer initializers by name (for tests that want to look at the hash's constants)."""
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type in INT_TYPES}
