"""Integer arithmetic that no backend can compute wrongly (export/int_bounds.py, the graphs'
declared ranges in sf_trt/graphs/ranges.py, export/OPS.md "Integer arithmetic").

Three things are checked, none needing TensorRT:

* the bounds proof: every integer Add/Sub/Mul/Div/Mod/Range of every graph export/ builds
  is proven inside (-2**24, 2**24) from the ranges the graph declares, and the proven
  intervals hold the values the graphs really compute on extreme inputs;
* the float32 emulation: every graph, with all its integer Add/Sub/Mul/Div/Mod rewritten
  into float32 arithmetic (what a backend that rounds them through float32 computes),
  gives bit-identical outputs on onnxruntime over more than 10**5 (key, position, token)
  triples, the corners of the domain among them;
* the analysis itself: sound on hand-made graphs, the remainder idiom recognised only
  when it is one.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from int_emulation import ARITHMETIC, float32_integer_arithmetic, integer_nodes
from sf_trt.graphs import noise as N
from sf_trt.graphs import verify as V
from sf_trt.graphs.copy_model import build_copy_graph
from sf_trt.export.int_bounds import EXACT_LIMIT, INT_TYPES, Interval, arithmetic_findings, integer_bounds
from sf_trt.export.registry import GRAPHS
from sf_trt.graphs.ranges import RANGES_KEY, declare_ranges, declared_ranges
from sf_trt.primitives import SampleRows

VOCAB, TOPK_LIMIT = 512, 64  # the registry's verify graph


def verify_variants():
    """Every verify graph a runner may pick, as built for engines and with the debug ``u``."""
    yield "greedy", V.build_greedy_graph(VOCAB)
    for top_k in (True, False):
        for top_p in (True, False):
            yield f"top_k={top_k} top_p={top_p}", V.build_verify_graph(VOCAB, TOPK_LIMIT, top_k=top_k, top_p=top_p)
    yield "debug", V.build_verify_graph(VOCAB, TOPK_LIMIT, debug=True)


def nucleus_graphs():
    """The nucleus path alone (onnxruntime's), each variant that has one."""
    for top_k, top_p in ((True, True), (True, False), (False, True)):
        yield f"nucleus top_k={top_k} top_p={top_p}", V.build_candidate_graph(VOCAB, TOPK_LIMIT, top_k=top_k, top_p=top_p)


def every_graph():
    for name, make in GRAPHS.items():
        yield f"registry {name}", make()
    yield from verify_variants()
    yield from nucleus_graphs()


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


# -- the bounds proof ------------------------------------------------------------------------


@pytest.mark.parametrize("name,model", list(every_graph()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_integer_operation_of_every_graph_is_proven_inside_2_to_24(name, model):
    assert arithmetic_findings(model) == [], name
    bounds = integer_bounds(model)
    for node in integer_nodes(model, ARITHMETIC):
        for tensor in list(node.input) + list(node.output):
            iv = bounds[tensor]
            assert iv is not None and iv.magnitude() < EXACT_LIMIT, (name, node.name, tensor, iv)


def test_the_verify_hash_is_all_integer_arithmetic_and_its_largest_value_is_as_documented():
    model = V.build_verify_graph(VOCAB, TOPK_LIMIT)
    nodes = integer_nodes(model, ARITHMETIC)
    assert {n.op_type for n in nodes} == {"Add", "Sub", "Mul", "Div"} and len(nodes) > 20
    bounds = integer_bounds(model)
    largest = max(bounds[o].hi for n in nodes for o in n.output)
    # the worst case over any vocabulary is t = A + p + p div 4096 = 4095 + 16764930 + 4093
    # (sf_trt/graphs/noise.py); this vocabulary's token states keep it a little smaller
    assert 16_700_000 < largest <= 16773118 < 2**24


def with_integer_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every integer tensor of its main graph also a graph output."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info}
    names = [o for n in model.graph.node for o in n.output if types.get(o) in INT_TYPES]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(h.make_tensor_value_info(n, types[n], None) for n in names if n not in have)
    return out, names


def sample(keys, positions) -> SampleRows:
    r = len(keys)
    return SampleRows(
        mode=np.ones(r, np.int64), temperature=np.full(r, 0.7, np.float32), top_p=np.full(r, 0.9, np.float32),
        top_k=np.array([0, 1, 5, 10**12, -3][: r] + [7] * max(0, r - 5), np.int64),  # 10**12 and -3: clamped
        rng_counter_base=np.asarray(keys, np.int64), position=np.asarray(positions, np.int64), draft=np.full(r, -1, np.int64),
    )


CORNER_KEYS = [0, 1, 2**62, 2**63 - 2, 2**63 - 1]
CORNER_POSITIONS = [0, 1, 2**30, 2**31 - 2, 2**31 - 1]


def corner_rows(extra: int, seed: int) -> SampleRows:
    """Every pairing of the corner keys and positions, then ``extra`` random rows."""
    rng = np.random.default_rng(seed)
    keys = [k for k in CORNER_KEYS for _ in CORNER_POSITIONS] + rng.integers(0, 2**63 - 1, extra, endpoint=True).tolist()
    positions = CORNER_POSITIONS * len(CORNER_KEYS) + rng.integers(0, 2**31, extra).tolist()
    return sample(keys, positions)


def verify_feeds(rows: SampleRows, seed: int = 0) -> dict[str, np.ndarray]:
    logits = np.random.default_rng(seed).normal(0, 3, (rows.num_rows, VOCAB)).astype(np.float32)
    return {V.LOGITS: logits, **V.sample_feeds(rows)}


def test_the_proven_intervals_hold_every_value_the_verify_graph_computes():
    model = V.build_verify_graph(VOCAB, TOPK_LIMIT)
    bounds = integer_bounds(model)
    probe, names = with_integer_outputs(model)
    feeds = verify_feeds(corner_rows(200, 1))
    # the noise keys at both ends of their declared ranges too
    feeds[V.NOISE_ADD][:2] = [[0, 0, 0], [N.LIMB - 1] * N.ROUNDS]
    feeds[V.NOISE_MUL][:2] = [[N.MUL_RANGE[0]] * N.ROUNDS, [N.MUL_RANGE[1]] * N.ROUNDS]
    values = dict(zip([o.name for o in probe.graph.output], session(probe).run(None, feeds)))
    assert len(names) >= 30
    for name in names:
        iv = bounds[name]
        assert iv is not None and iv.lo <= values[name].min() and values[name].max() <= iv.hi, (name, iv)
    computed = {o for n in integer_nodes(model, ARITHMETIC) for o in n.output}
    assert max(int(np.abs(values[n]).max()) for n in computed) < EXACT_LIMIT


# -- the float32 emulation -----------------------------------------------------------------


def assert_same(a: list[np.ndarray], b: list[np.ndarray], what: str) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape, what
        assert x.tobytes() == y.tobytes(), what  # bit for bit, -0.0 and NaN payloads included


@pytest.mark.parametrize("name,model", list(verify_variants()), ids=lambda x: x if isinstance(x, str) else "")
def test_verify_draws_are_bit_identical_with_integer_arithmetic_in_float32(name, model):
    """256 rows x 512 tokens = 131072 (key, position, token) triples per variant."""
    rows = corner_rows(256 - 25, 2)
    feeds = verify_feeds(rows, seed=3)
    rewritten = float32_integer_arithmetic(model)
    if name != "greedy":
        assert len(integer_nodes(model)) > 20 and integer_nodes(rewritten) == []  # the rewrite is not vacuous
    assert_same(session(model).run(None, feeds), session(rewritten).run(None, feeds), name)
    if name == "debug":  # u itself, every triple, against the numpy hash
        u = session(rewritten).run(["u"], feeds)[0][:, :VOCAB]
        np.testing.assert_array_equal(u, N.hash_u(rows.rng_counter_base, rows.position, VOCAB))
        assert u.size >= 10**5


@pytest.mark.parametrize("name,model", list(nucleus_graphs()), ids=lambda x: x if isinstance(x, str) else "")
def test_the_nucleus_path_is_bit_identical_with_integer_arithmetic_in_float32(name, model):
    """Its proof is test_every_integer_operation_of_every_graph_is_proven_inside_2_to_24's."""
    feeds = verify_feeds(corner_rows(256 - 25, 2), seed=3)
    rewritten = float32_integer_arithmetic(model)
    assert len(integer_nodes(model)) > 20 and integer_nodes(rewritten) == []
    out = session(model).run(None, feeds)
    assert_same(out, session(rewritten).run(None, feeds), name)
    assert out[2].sum() > 100  # the draws compared are mostly the nucleus path's own


def test_the_copy_model_is_bit_identical_with_integer_arithmetic_in_float32():
    vocab, lanes, context = 2**21, 3, 40  # the largest vocab its declared ranges keep exact
    model = build_copy_graph(vocab=vocab, eos=vocab - 1, max_lanes=lanes, max_context=context, copy_miss_every=3)
    assert arithmetic_findings(model) == []
    rng = np.random.default_rng(4)
    history = rng.integers(0, vocab, (lanes, context))
    history[0, :4] = [vocab - 1, vocab - 2, vocab - 1, vocab - 3]  # the largest ids, and eos, repeated
    feeds = {"history": history, "lanes": np.repeat(np.arange(lanes), context), "positions": np.tile(np.arange(context), lanes)}
    rewritten = float32_integer_arithmetic(model)
    assert integer_nodes(rewritten) == []
    assert_same(session(model).run(None, feeds), session(rewritten).run(None, feeds), "copy model")


def runnable(name: str) -> onnx.ModelProto:
    """The registry graph, or for the decoder the same graph with a symbolic cache length:
    onnxruntime refuses the registry's static-length decoder ("Input to 'Range' op should
    be scalars", on main as well); the integer ops are the same."""
    if name != "decoder":
        return GRAPHS[name]()
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    return build_decoder_graph(cfg, random_llama_weights(cfg, seed=0), max_lanes=2)


def test_every_registry_graph_is_bit_identical_with_integer_arithmetic_in_float32():
    for name in GRAPHS:
        model = runnable(name)
        assert arithmetic_findings(model) == [], name
        feeds = registry_feeds(name, model)
        assert_same(session(model).run(None, feeds), session(float32_integer_arithmetic(model)).run(None, feeds), name)


def registry_feeds(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    if name == "verify":
        return verify_feeds(corner_rows(20, 6))
    if name == "copy_model":
        return {"history": rng.integers(0, 512, (4, 128)), "lanes": np.array([0, 3, 3, 1]), "positions": np.array([0, 127, 5, 64])}
    if name.startswith("decoder"):  # every family's (registry.FAMILY_DECODERS)
        feeds = {"input_ids": rng.integers(0, 64, (2, 3)), "positions": np.array([[0, 1, 2], [10, 11, 64]]),
                 "lane_ids": np.array([1, 0]), "logit_index": np.array([0, 2, 4])}
        for vi in model.graph.input:
            if vi.name.startswith("past_"):
                shape = [d.dim_value or 65 for d in vi.type.tensor_type.shape.dim]  # cache_len: 65 slots
                feeds[vi.name] = rng.normal(size=shape).astype(np.float32)
        return feeds
    if name == "logprobs":
        logits = rng.normal(size=(5, 500)).astype(np.float32)
        return {"logits": logits, "tokens": np.array([0, 499, 7, 250, 1])}
    if name == "adjust":
        ids = np.array([[0, 499, 7], [250, 250, 250]])
        feeds = {"logits": rng.normal(size=(2, 500)).astype(np.float32), "adjust_ids": ids}
        for n, v in zip(("adjust_bias", "adjust_scale", "adjust_frequency", "adjust_presence"), (0.5, 1.3, 0.2, -0.4)):
            feeds[n] = np.full(ids.shape, v, np.float32)
        return feeds
    raise AssertionError(f"registry graph {name!r} has no feeds here: add them")


# -- the analysis itself ---------------------------------------------------------------------


def _graph(nodes, inputs, outputs, inits=()):
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", 17)])


def _i64(name, value):
    return nh.from_array(np.asarray(value, np.int64), name)


def test_intervals_are_sound_on_a_graph_of_every_kind_of_op():
    nodes = [
        h.make_node("Add", ["x", "y"], ["s"]), h.make_node("Sub", ["x", "y"], ["d"]), h.make_node("Mul", ["x", "y"], ["p"]),
        h.make_node("Div", ["p", "seven"], ["q"]), h.make_node("Mod", ["d", "seven"], ["r"]),
        h.make_node("Mod", ["d", "seven"], ["rf"], fmod=1), h.make_node("Neg", ["d"], ["n"]), h.make_node("Abs", ["d"], ["a"]),
        h.make_node("Max", ["x", "y"], ["mx"]), h.make_node("Min", ["x", "y"], ["mn"]),
        h.make_node("Greater", ["x", "y"], ["gt"]), h.make_node("Where", ["gt", "s", "d"], ["w"]),
        h.make_node("Cast", ["gt"], ["gi"], to=T.INT64), h.make_node("Gather", ["table", "x"], ["g"], axis=0),
        h.make_node("Shape", ["x"], ["sh"]), h.make_node("Range", ["zero", "ten", "one"], ["rg"]),
        h.make_node("ReduceMax", ["p"], ["rm"], keepdims=0), h.make_node("Concat", ["s", "d"], ["c"], axis=0),
    ]
    inputs = [h.make_tensor_value_info("x", T.INT64, ["n"]), h.make_tensor_value_info("y", T.INT64, ["n"])]
    outs = ["s", "d", "p", "q", "r", "rf", "n", "a", "mx", "mn", "w", "gi", "g", "sh", "rg", "rm", "c"]
    inits = [_i64("seven", 7), _i64("table", np.arange(20) * 3 - 11), _i64("zero", 0), _i64("ten", 10), _i64("one", 1)]
    model = _graph(nodes, inputs, [h.make_tensor_value_info(o, T.INT64, None) for o in outs], inits)
    declare_ranges(model, inputs={"x": (0, 19), "y": (-5, 9)}, dims={"n": (1, 50)})
    bounds = integer_bounds(model)
    rng = np.random.default_rng(7)
    s = session(model)
    for trial in range(50):
        n = int(rng.integers(1, 51))
        x = rng.integers(0, 20, n)
        y = rng.integers(-5, 10, n)
        if trial == 0:
            x, y = np.array([0, 19, 0, 19]), np.array([-5, -5, 9, 9])
        for name, value in zip(outs, s.run(outs, {"x": x, "y": y})):
            iv = bounds[name]
            assert iv is not None and iv.lo <= value.min() and value.max() <= iv.hi, (name, iv, value)
    assert bounds["sh"] == Interval(1, 50) and bounds["rg"] == Interval(0, 9) and bounds["g"] == Interval(-11, 46)


def _remainder_graph(div_by: int, mul_by: int, x_range=(0, 2**23)):
    nodes = [
        h.make_node("Div", ["x", "c1"], ["q"]), h.make_node("Mul", ["q", "c2"], ["m"]), h.make_node("Sub", ["x", "m"], ["r"]),
        h.make_node("Mod", ["r", "c3"], ["out"]),
    ]
    model = _graph(
        nodes, [h.make_tensor_value_info("x", T.INT64, ["n"])], [h.make_tensor_value_info("out", T.INT64, None)],
        [_i64("c1", div_by), _i64("c2", mul_by), _i64("c3", 5)],
    )
    return declare_ranges(model, inputs={"x": x_range})


def test_the_remainder_idiom_is_recognised_only_when_it_is_one():
    assert integer_bounds(_remainder_graph(4096, 4096))["r"] == Interval(0, 4095)
    assert integer_bounds(_remainder_graph(4096, 4096, (-100, 100)))["r"] == Interval(-100, 0).union(Interval(0, 100))
    wrong = integer_bounds(_remainder_graph(4096, 4095))["r"]  # not x mod c: plain interval arithmetic
    assert wrong.hi > 4095
    # a Mod of the wrong pattern's result is refused by the check: its dividend is not proven small
    wide = _remainder_graph(4096, 4095, (0, 2**30))
    assert [(f.node, f.severity) for f in arithmetic_findings(wide) if f.op_type == "Mod"] == [("#3", "error")]


def test_ranges_are_recorded_and_read_back_and_bad_ones_refused():
    model = _graph([h.make_node("Identity", ["x"], ["y"])], [h.make_tensor_value_info("x", T.INT64, [1])], [h.make_tensor_value_info("y", T.INT64, None)])
    declare_ranges(model, inputs={"x": (0, 9)}, dims={"n": (1, 4)})
    declare_ranges(model, inputs={"x": (2, 3)})  # a second record replaces the first
    assert declared_ranges(model) == ({"x": (2, 3)}, {})
    assert [p.key for p in model.metadata_props] == [RANGES_KEY]
    with pytest.raises(ValueError, match=r"\['z'\] are not inputs of the graph"):
        declare_ranges(model, inputs={"z": (0, 1)})
    with pytest.raises(ValueError, match=r"input 'x' range \[3, 2\] is empty"):
        declare_ranges(model, inputs={"x": (3, 2)})
    model.metadata_props[0].value = "not json"
    with pytest.raises(ValueError, match="is not a ranges record"):
        declared_ranges(model)
