#!/usr/bin/env python3
"""Run this first on a GPU machine: sf_trt's TensorRT path checked against the CPU, as one table.

    python tools/trt_device_check.py [--out DIR] [--json FILE] [--gguf PATH] [--skip-real] [--max-tokens N]

It builds small engines (and the real model's) and checks, one row each (PASS, FAIL or NOTE):

(a) integer division: one-node int64 ``Mod`` and ``Div`` engines against numpy, on operands
    below 2**24 with power-of-two divisors (what sf_trt's verify and decoder graphs divide by:
    must be exact), with other divisors (a NOTE: a division through a float32 reciprocal may
    round them, and only the copy-model fake divides by them) and on the values of
    NVIDIA/TensorRT#4702 and Torch-TensorRT#3230 up to 2**62 (a NOTE either way);
(b) the verify engine: its ``u`` against ``hash_u`` and its tokens against
    ``reference_verify_sample``, bit for bit, for random keys and positions (0, 2**63 - 1 and
    2**31 - 1 among them); the production verify engine draws the debug engine's tokens;
(c) packing: one lane's rows alone and inside wider passes (other lanes beside it, split
    otherwise, at another slot): decoder logits and verify tokens bit for bit, with tiny
    decoders in fp32, fp16, bf16 and with int8 weights (the export default); each also
    against onnxruntime running the same graph (bf16: the fp32 graph) within its precision;
(d) the real model (SmolLM2-135M-Instruct) exported fp16 from a local GGUF (``--gguf``, or the
    cached default; never fetched): greedy agreement with onnxruntime fp32 on
    tools/prompts/bench.jsonl, and speculative == plain, greedy and sampled;
(e) CUDA-graph replay == eager enqueue, bit for bit, and every engine's graph was captured
    (a capture that fell back to plain enqueues FAILs);
(f) tokens/s, plain and speculative, on the real model;
(g) the seed contract (tests/test_prompt_lookup.py) on the TensorRT fake (the copy model);
(h) rows in every slot of the full-shape real-model engine (8 lanes x 16 rows, the build's
    default): one continuation in every lane at t = 0..15, every slot's logits bit for bit
    against the same row computed alone (one row a pass), lane slot 0 against slot 5 named
    (NVIDIA/TensorRT#4796, #4853: identical rows of a batch that differ).

The table goes to the screen; every row with its details to ``--json`` (default
``trt_device_check.json``: :data:`SCHEMA`, the TensorRT, CUDA, driver and GPU it ran on),
tracebacks to ``--json`` with ``.log``; engines are cached under ``--out`` (default
``.trt_device_check/``). Target: under 8 minutes on one GPU.

Exit status: 0 every check asked for PASSed (:func:`verdict`: a check that did not run,
or ran without passing, is no pass); 1 a row FAILed or a check did not pass; 2 TensorRT,
torch with CUDA or a GPU is missing here, or the stack's CUDA majors disagree (one line,
nothing run). The check functions take any backend, so the tests
run them on onnxruntime standing in for the engines (tests/backends/tensorrt/test_stand_in.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

TINY_SHAPES = dict(max_lanes=4, rows_per_lane=8, max_context=64)
"""The tiny decoder's engines: 4 lanes of 8 rows a run (32 logit rows), 64 positions."""
REAL_SHAPES = dict(max_lanes=8, rows_per_lane=16, max_context=512)
"""The real model's engines at the build's default shape (8 lanes x 16 rows = 128 rows a run);
the bench prompts (up to ~310 tokens) and their outputs fit."""
TINY_VARIANTS = {"fp32": ("float32", "fp32"), "fp16": ("float32", "fp16"), "bf16": ("float32", "bf16"), "int8": ("int8", "fp32")}
"""The tiny decoders (c) builds: ``variant -> (weights, precision)``; int8 weights are the export's default."""
CLOSE_TO_ORT = {"fp32": 1e-3, "int8": 1e-3, "fp16": 3e-2, "bf16": 2.5e-1}
"""Largest |logit difference| of each tiny engine against onnxruntime running its graph (bf16: the fp32
graph, onnxruntime has no bfloat16 MatMul on the CPU); the tiny model's logits are within +-4."""
SCHEMA = {
    "schema": int, "environment": dict, "requested": list, "complete": bool, "failed": bool, "passed": bool, "rows": list,
}
"""The JSON's top-level keys and their types (``schema`` = 2)."""
ENVIRONMENT_KEYS = ("tensorrt", "tensorrt_wheel", "torch", "torch_cuda", "driver", "driver_cuda", "gpu", "onnxruntime")
"""What ``environment`` records: TensorRT (and its wheel's CUDA major), torch and its CUDA runtime,
the kernel driver and the CUDA it supports, the GPU, the onnxruntime wheels installed."""
ROW_KEYS = ("id", "check", "status", "seconds", "detail", "data")
CHECKS = {"a": "integer division", "b": "verify engine", "c": "packing (tiny decoders)", "d": "real model",
          "e": "CUDA-graph replay", "g": "seed contract", "h": "full-shape rows"}
"""The checks that must each PASS (at least one row, none failed) for the run to pass; (d) and (h)
need the real model (``--skip-real`` leaves them out, and the JSON says ``complete: false``)."""
REAL_CHECKS = ("d", "h")
VERIFY_VOCAB, VERIFY_TOP_K = 512, 64
STATUSES = ("PASS", "FAIL", "NOTE")


class Missing(Exception):
    """TensorRT, torch with CUDA, or a GPU is missing: nothing can run (exit 2)."""


class Note(Exception):
    """A finding to report that is not a failure of sf_trt (the row says NOTE)."""


def note(text: str):
    raise Note(text)


# -- the table -------------------------------------------------------------------------------


@dataclasses.dataclass
class Row:
    id: str
    check: str
    status: str
    seconds: float
    detail: str
    data: Any = None


class Table:
    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.logs: list[str] = []

    def run(self, rid: str, check: str, fn: Callable[[], Any]) -> Any:
        """Run one check: it returns a detail (or ``(detail, data)``), raises Note, or fails."""
        t0 = time.perf_counter()
        try:
            result = fn()
            status = "PASS"
        except Note as note:
            result, status = str(note), "NOTE"
        except Exception as exc:  # a check reports, it never stops the others
            self.logs.append(f"== {rid} {check}\n{traceback.format_exc()}")
            result, status = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", "FAIL"
        detail, data = result if isinstance(result, tuple) else (result, None)
        self.rows.append(Row(rid, check, status, time.perf_counter() - t0, str(detail or ""), data))
        return data

    def print(self) -> None:
        w = max(len(f"({r.id}) {r.check}") for r in self.rows)
        print(f"\n{'check':{w}}  result  seconds  detail")
        print(f"{'-' * w}  ------  -------  ------")
        for r in self.rows:
            print(f"{f'({r.id}) {r.check}':{w}}  {r.status:6}  {r.seconds:7.1f}  {r.detail}")

    @property
    def failed(self) -> bool:
        return any(r.status == "FAIL" for r in self.rows)

    def to_json(self, environment: dict, requested: list[str]) -> dict:
        passed, missing = verdict(self.rows, requested)
        return {
            "schema": 2, "environment": environment, "requested": list(requested), "complete": set(requested) >= set(CHECKS),
            "failed": self.failed, "passed": passed, "not_passed": missing, "rows": [dataclasses.asdict(r) for r in self.rows],
        }


def verdict(rows: list[Row], requested: list[str]) -> tuple[bool, list[str]]:
    """``(passed, the requested checks that did not pass)``: a check passes when it has at least one
    row, a PASS among them, and no FAIL. A run with a FAIL anywhere does not pass; nor does one where a
    requested check left no row (it crashed before reporting) or only NOTEs."""
    missing = []
    for cid in requested:
        statuses = [r.status for r in rows if r.id == cid]
        if "FAIL" in statuses or "PASS" not in statuses:
            missing.append(cid)
    return not missing and not any(r.status == "FAIL" for r in rows), missing


def check_report(report: dict) -> list[str]:
    """How a JSON report departs from :data:`SCHEMA` (empty: it conforms)."""
    problems = [f"{k}: missing" for k in SCHEMA if k not in report]
    problems += [f"{k}: {type(report[k]).__name__}, expected {t.__name__}" for k, t in SCHEMA.items() if k in report and not isinstance(report[k], t)]
    env = report.get("environment", {})
    problems += [f"environment.{k}: missing" for k in ENVIRONMENT_KEYS if k not in env]
    for i, row in enumerate(report.get("rows", [])):
        problems += [f"rows[{i}].{k}: missing" for k in ROW_KEYS if k not in row]
        if row.get("status") not in STATUSES:
            problems.append(f"rows[{i}].status: {row.get('status')!r}, expected one of {STATUSES}")
    full = [r for r in report.get("rows", []) if r.get("id") == "h" and r.get("status") == "PASS"]
    for r in full:
        data = r.get("data") or {}
        problems += [f"rows (h).data.{k}: missing" for k in ("lanes", "rows_per_lane", "slots_compared", "slot0_vs_slot5", "mismatched_slots") if k not in data]
    return problems


# -- checks that run on any backend (the tests run them on the onnxruntime stand-in) ----------


def rows(lanes, positions, tokens, logit_rows):
    from sf_trt.primitives import Rows

    return Rows(*(np.asarray(a, np.int64) for a in (lanes, positions, tokens, logit_rows)))


def sample_rows(n: int, keys, positions, *, gumbel: bool = True, temperature: float = 0.9, top_p: float = 0.9, top_k: int = 0):
    from sf_trt.abi import Sampling
    from sf_trt.primitives import SampleRows

    mode = int(Sampling.GPU_GUMBEL if gumbel else Sampling.GPU_GREEDY)
    return SampleRows(
        mode=np.full(n, mode, np.int64), temperature=np.full(n, temperature, np.float32), top_p=np.full(n, top_p, np.float32),
        top_k=np.full(n, top_k, np.int64), rng_counter_base=np.asarray(keys, np.int64), position=np.asarray(positions, np.int64),
        draft=np.full(n, -1, np.int64),
    )


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def verify_feeds(rng: np.random.Generator, n: int, vocab: int, top_k_limit: int) -> dict[str, np.ndarray]:
    """``n`` rows of logits and sampling fields, extremes of the key and position included."""
    keys = rng.integers(0, 2**63 - 1, n, dtype=np.int64, endpoint=True)
    positions = rng.integers(0, 2**31, n, dtype=np.int64)
    keys[:2], positions[:2] = [0, 2**63 - 1], [0, 2**31 - 1]
    return {
        "logits": rng.normal(0, rng.uniform(0.5, 4), (n, vocab)).astype(np.float32),
        "mode": (rng.random(n) < 0.8).astype(np.int64),
        "temperature": rng.choice([0.25, 0.5, 0.8, 1.0, 1.7], n).astype(np.float32),
        "top_p": rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.2], n).astype(np.float32),
        "top_k": rng.choice([0, 0, 1, 3, 7, top_k_limit, 1000], n).astype(np.int64),
        "rng_counter_base": keys, "position": positions, "draft": rng.integers(-1, vocab, n, dtype=np.int64),
    }


def verify_against_reference(run_debug: Callable, run_plain: Callable | None, rows_per_run: int, vocab: int, top_k_limit: int, runs: int = 4) -> str:
    """(b): ``run_debug(graph feeds) -> {"tokens", "u", ...}`` (host arrays) runs the debug verify
    graph (``build_verify_graph(..., debug=True)``) as an engine of ``rows_per_run`` rows; its
    ``u`` must be ``hash_u`` bit for bit, its tokens ``reference_verify_sample``'s on every row
    not within float rounding of a flip (the criterion of tests/graphs/test_verify.py), and
    ``run_plain`` (the production verify engine, when given) must draw the same tokens."""
    from sf_trt.graphs import noise as N
    from sf_trt.graphs import verify as V
    from sf_trt.graphs.reference import reference_verify_sample

    rng = np.random.default_rng(20260101)
    robust_rows = checked = 0
    for _ in range(runs):
        f = verify_feeds(rng, rows_per_run, vocab, top_k_limit)
        feeds = {"logits": f["logits"], **V.sample_feeds(sample_rows_from(f))}
        out = run_debug(feeds)
        u = np.asarray(out["u"])[:, :vocab]
        want_u = N.hash_u(f["rng_counter_base"], f["position"], vocab)
        if not np.array_equal(u.astype(np.float64), want_u):
            bad = int(np.sum(u.astype(np.float64) != want_u))
            raise AssertionError(f"u differs from hash_u in {bad} of {u.size} values")
        ref, _, d = reference_verify_sample(**f, top_k_limit=top_k_limit, details=True)
        gumbel = f["mode"] == V.GUMBEL
        fragile = gumbel & ((d["score_gap"] < 1e-4) | (d["mass_gap"] < 1e-4) | (d["lo_gap"] < 1e-4))
        tokens = np.asarray(out["tokens"])
        wrong = np.flatnonzero(~fragile & (tokens != ref))
        if wrong.size:
            i = int(wrong[0])
            raise AssertionError(f"{wrong.size} robust rows draw other tokens than the reference (row {i}: {tokens[i]} vs {ref[i]})")
        if run_plain is not None:
            plain = np.asarray(run_plain(feeds)["tokens"])
            if not np.array_equal(plain, tokens):
                raise AssertionError(f"the production verify engine draws other tokens than the debug one on {int(np.sum(plain != tokens))} rows")
        robust_rows += int(np.sum(~fragile))
        checked += rows_per_run
    return f"{checked} rows ({robust_rows} away from float near-ties), u == hash_u bit for bit, tokens == reference"


def sample_rows_from(f: dict):
    from sf_trt.primitives import SampleRows

    return SampleRows(**{k: f[k] for k in ("mode", "temperature", "top_p", "top_k", "rng_counter_base", "position", "draft")})


def packing(make_prims: Callable[[], Any], vocab: int, n_tokens: int = 20) -> str:
    """(c): lane 0's rows one per pass (a plain decode), against the same tokens on lane 2 in
    passes shared with lanes 0, 1 and 3 and split into chunks of 3, 5 and 2 rows: every logit
    bit and every drawn token the same. ``make_prims()`` opens a decoder backend of >= 4 lanes."""
    rng = np.random.default_rng(7)
    seq = rng.integers(0, vocab, n_tokens)
    keys, draws = 4242, lambda positions: sample_rows(len(positions), [4242] * len(positions), np.asarray(positions) + 1)

    alone = make_prims()
    logits_alone, tokens_alone = [], []
    for p in range(n_tokens):
        out = alone.forward(rows([0], [p], [seq[p]], [0]))
        logits_alone.append(alone.logits_host(out)[0].copy())
        tokens_alone.append(int(alone.verify_sample(out, draws([p]))[0][0]))
    alone.close()

    packed = make_prims()
    logits_packed, tokens_packed, start, k = {}, {}, 0, 0
    others = {lane: rng.integers(0, vocab, n_tokens) for lane in (0, 1, 3)}
    filled = {lane: 0 for lane in others}
    chunks = [3, 5, 2]
    while start < n_tokens:
        n = min(chunks[k % len(chunks)], n_tokens - start)
        lanes, positions, tokens = [], [], []
        for lane, m in ((1, 1 + k % 2), (2, n), (0, 2), (3, 1)):  # lane 2 carries the sequence
            if lane == 2:
                lanes += [2] * n
                positions += range(start, start + n)
                tokens += list(seq[start : start + n])
            else:
                m = min(m, n_tokens - filled[lane])
                lanes += [lane] * m
                positions += range(filled[lane], filled[lane] + m)
                tokens += list(others[lane][filled[lane] : filled[lane] + m])
                filled[lane] += m
        out = packed.forward(rows(lanes, positions, tokens, range(len(lanes))))
        host = packed.logits_host(out)
        sample = sample_rows(len(lanes), [keys if lane == 2 else 7 + lane for lane in lanes], np.asarray(positions) + 1)
        drawn = packed.verify_sample(out, sample)[0]
        for i, (lane, pos) in enumerate(zip(lanes, positions)):
            if lane == 2:
                logits_packed[pos], tokens_packed[pos] = host[i].copy(), int(drawn[i])
        start += n
        k += 1
    packed.close()
    got = np.stack([logits_packed[p] for p in range(n_tokens)])
    want = np.stack(logits_alone)
    if not np.array_equal(bits(got), bits(want)):
        bad = int(np.any(bits(got) != bits(want), axis=1).sum())
        raise AssertionError(f"{bad} of {n_tokens} rows' logits differ packed vs alone (max {float(np.abs(got - want).max()):.3g})")
    if [tokens_packed[p] for p in range(n_tokens)] != tokens_alone:
        raise AssertionError("drawn tokens differ packed vs alone")
    return f"{n_tokens} rows: logits and Gumbel draws bit for bit, alone (slot 0, one row a pass) vs packed (slot 2, chunks of 3/5/2 beside 3 lanes)"


def speculative_equals_plain(make_prims: Callable[[Any], Any], prompts: list[list[int]], *, per_tick: int = 16, ticks: int = 3) -> str:
    """Lanes together, greedy and sampled: speculating emits what a plain decode emits.
    ``make_prims(FakeConfig)`` makes the backend (a decoder's ignores the config)."""
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.fake import FakeConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    cfg = FakeConfig(vocab=512, eos=511, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=8, max_context=256, max_rows_per_pass=256)
    modes = [
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ]

    def run(speculate: bool, mode, params) -> tuple[list[list[int]], int]:
        h = Harness.with_engine(Executor(make_prims(cfg), ExecutorConfig()))
        slot = register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
        lane_ids = range(1, len(prompts) + 1)
        plan = h.plan()
        for lane, prompt in zip(lane_ids, prompts):
            plan = plan.admit(lane, h.prompt(prompt), strategy_slot=slot, sampling=mode, params=params, rng_counter_base=lane)
            plan = plan.prefill(lane, 0, len(prompt))
        out, proposed = {lane: [] for lane in lane_ids}, 0
        for _ in range(ticks):
            for lane in lane_ids:
                plan = plan.decode(lane, per_tick)
            ev = h.tick_ok(plan)
            for lane in lane_ids:
                e = ev.emit_for(lane)
                out[lane] += h.rings_tokens(e.token_ref)
                proposed += e.spec.proposed
            plan = h.plan()
        return [out[lane] for lane in lane_ids], proposed

    want, drafts = per_tick * ticks, 0
    for mode, params in modes:
        (plain, _), (spec, proposed) = run(False, mode, params), run(True, mode, params)
        if any(len(t) != want for t in plain):
            raise AssertionError(f"{mode.name}: expected {want} tokens per lane, got {[len(t) for t in plain]}")
        if plain != spec:
            raise AssertionError(f"{mode.name}: speculative decode differs from plain")
        drafts += proposed
    return f"{len(prompts)} lanes x {len(modes)} modes, {want} tokens each, {drafts} draft tokens verified: speculative == plain"


def replay_equals_eager(make_prims: Callable[[bool], Any], vocab: int) -> str:
    """(e): the same passes (prefill, decode steps, verify passes, a rollback) on
    ``make_prims(cuda_graphs=True)`` and ``make_prims(cuda_graphs=False)``: logits and tokens bit for bit."""
    rng = np.random.default_rng(11)
    seq = {lane: rng.integers(0, vocab, 24) for lane in range(3)}
    passes = [
        ([0] * 8, list(range(8)), list(seq[0][:8])),
        ([1] * 5 + [0], list(range(5)) + [8], list(seq[1][:5]) + [seq[0][8]]),
        ([0, 1, 2], [9, 5, 0], [seq[0][9], seq[1][5], seq[2][0]]),
        ([0, 1, 2], [10, 6, 1], [seq[0][10], seq[1][6], seq[2][1]]),
        ([0] * 4 + [2], [11, 12, 13, 14, 2], list(seq[0][11:15]) + [seq[2][2]]),  # a verify pass
    ]
    results, captured = [], {}
    for graphs in (True, False):
        p = make_prims(graphs)
        got = []
        for lanes, positions, tokens in passes:
            out = p.forward(rows(lanes, positions, tokens, range(len(lanes))))
            drawn = p.verify_sample(out, sample_rows(len(lanes), [9] * len(lanes), np.asarray(positions) + 1))[0]
            got.append((bits(p.logits_host(out)).copy(), drawn.copy()))
        p.truncate(0, 12)  # a rejected tail, rewritten by the next pass
        out = p.forward(rows([0], [12], [seq[0][20]], [0]))
        got.append((bits(p.logits_host(out)).copy(), np.zeros(0)))
        if graphs:
            captured = p.graphs_captured()
        p.close()
        results.append(got)
    fell_back = sorted(name for name, ok in captured.items() if not ok)
    if not captured or fell_back:
        raise AssertionError(f"no CUDA graph was captured for {fell_back or 'any engine'}: the replay compared plain enqueues with plain enqueues")
    for i, ((a, ta), (b, tb)) in enumerate(zip(*results)):
        if not (np.array_equal(a, b) and np.array_equal(ta, tb)):
            raise AssertionError(f"pass {i}: replayed and eager runs differ")
    return f"{len(passes) + 1} passes (prefill, decode, verify, rollback), graphs captured for {sorted(captured)}: logits and tokens bit for bit"


def full_shape_rows(make_prims: Callable[[], Any], prompt: list[int], continuation: list[int]):
    """(h): ``continuation`` (``T`` tokens, ``T`` = the engine's rows per lane) after ``prompt`` in
    every lane of a full-shape pass, so every one of the ``L x T`` slots of the run holds a row
    (``t > 0`` included); each slot's logits bit for bit against the same row computed alone (lane
    0, one row a pass). ``(detail, data)``; AssertionError naming the slots that differ."""
    alone = make_prims()
    L, T = alone.capabilities.max_lanes, len(continuation)
    seq = list(prompt) + list(continuation)
    want = []
    for p_ in range(len(seq)):
        out = alone.forward(rows([0], [p_], [seq[p_]], [0]))
        if p_ >= len(prompt):
            want.append(bits(alone.logits_host(out)[0]).copy())
    alone.close()
    full = make_prims()
    n = len(prompt)
    for lane in range(L):  # the prompt into every lane (its own passes: the cache rows are compared through the logits)
        full.forward(rows([lane] * n, range(n), prompt, []))
    lanes = np.repeat(np.arange(L), T)
    out = full.forward(rows(lanes, np.tile(np.arange(n, n + T), L), np.tile(continuation, L), range(L * T)))
    got = bits(full.logits_host(out)).reshape(L, T, -1)
    full.close()
    mismatched = [[lane, t] for lane in range(L) for t in range(T) if not np.array_equal(got[lane, t], want[t])]
    slot0_vs_5 = bool(L > 5 and np.array_equal(got[0], got[5]))
    data = {"lanes": L, "rows_per_lane": T, "slots_compared": L * T, "slot0_vs_slot5": slot0_vs_5, "mismatched_slots": mismatched}
    if mismatched or (L > 5 and not slot0_vs_5):
        raise AssertionError(
            f"{len(mismatched)} of {L * T} slots differ from the row alone (first: lane, t = {mismatched[:4]}); "
            f"lane slot 0 {'==' if slot0_vs_5 else '!='} slot 5"
        )
    return f"{L} lanes x {T} rows: all {L * T} slots bit for bit == the row alone; lane slot 0 == slot 5", data


def close_to_reference(make_prims: Callable[[], Any], make_ref: Callable[[], Any], vocab: int, atol: float):
    """(c): the same passes on an engine and on onnxruntime running its graph: largest |difference|
    of the logits at most ``atol``. ``(detail, data)``."""
    rng = np.random.default_rng(5)
    seq = rng.integers(0, vocab, 12)
    passes = [([0] * 6, list(range(6)), list(seq[:6])), ([0, 2], [6, 0], [seq[6], seq[7]]), ([0, 2, 2], [7, 1, 2], [seq[8], seq[9], seq[10]])]
    worst, p, ref = 0.0, make_prims(), make_ref()
    for lanes, positions, tokens in passes:
        r = rows(lanes, positions, tokens, range(len(lanes)))
        worst = max(worst, float(np.abs(p.logits_host(p.forward(r)) - ref.logits_host(ref.forward(r))).max()))
    p.close()
    ref.close()
    if not worst <= atol:
        raise AssertionError(f"logits differ from onnxruntime's by up to {worst:.3g}, expected at most {atol}")
    return f"logits within {worst:.3g} of onnxruntime's (at most {atol})", {"max_abs_diff": worst, "atol": atol}


def seed_contract(make_primitives: Callable[[Any], Any], label: str) -> str:
    """tests/test_prompt_lookup.py with its FakePrimitives replaced by ``make_primitives(cfg)``."""
    spec = importlib.util.spec_from_file_location("sf_trt_seed_contract", ROOT / "tests" / "test_prompt_lookup.py")
    seed = sys.modules["sf_trt_seed_contract"] = importlib.util.module_from_spec(spec)  # a copy of its own (dataclasses look it up)
    spec.loader.exec_module(seed)
    tests = [(n, f) for n, f in vars(seed).items() if n.startswith("test_") and callable(f)]
    failed = []
    original = seed.FakePrimitives
    seed.FakePrimitives = make_primitives
    try:
        for name, fn in tests:
            try:
                fn()
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
    finally:
        seed.FakePrimitives = original
    if failed:
        raise AssertionError(f"{len(failed)} of {len(tests)} seed tests failed: " + " | ".join(failed)[:400])
    return f"{len(tests)} seed tests pass on {label}"


def fake_shapes(cfg) -> dict:
    """The engine shapes of the TensorRT fake for a FakeConfig: its lanes and context, one row a lane
    (a run takes a pass's logit rows, which a fake pass has at most max_lanes of in decode steps)."""
    return dict(max_lanes=cfg.max_lanes, rows_per_lane=1, max_context=cfg.max_context)


def copy_graph(cfg):
    from sf_trt.graphs.copy_model import build_copy_graph

    return build_copy_graph(cfg.vocab, cfg.eos, cfg.max_lanes, cfg.max_context, cfg.copy_miss_every, cfg.copy_model, cfg.favour_logit)


def fake_caps(cfg) -> dict:
    return dict(
        eos=cfg.eos, verify_rows=cfg.verify_rows, truncate_partial=cfg.truncate_partial,
        kernel_capabilities=cfg.kernel_capabilities, top_k_limit=min(cfg.top_k_limit, cfg.vocab), max_rows_per_pass=cfg.max_rows_per_pass,
    )


def stand_in_fake(cfg):
    """The TensorRT fake's pass logic on onnxruntime (CPU): the same graphs, no engines."""
    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.formats.shapes import ShapeLimits
    from sf_trt.graphs.verify import build_verify_graph

    caps = fake_caps(cfg)
    return TensorRTPrimitives.stand_in(copy_graph(cfg), build_verify_graph(cfg.vocab, caps["top_k_limit"]), ShapeLimits(**fake_shapes(cfg)), **caps)


def tiny_decoder(variant: str = "fp32"):
    """``(LlamaConfig, graph)`` of the tiny random Llama as :data:`TINY_VARIANTS` ``variant``
    (a precision, or ``int8`` weights), caches symbolic (as exported)."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    weights, precision = TINY_VARIANTS[variant]
    return cfg, build_decoder_graph(cfg, random_llama_weights(cfg, seed=0), weight_dtype=weights, precision=precision)


def tiny_stand_in(variant: str = "fp32", shapes: dict | None = None):
    """The tiny decoder's pass logic on onnxruntime (CPU), at the tiny engines' shapes (or ``shapes``)."""
    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.formats.shapes import ShapeLimits
    from sf_trt.graphs.verify import build_verify_graph

    cfg, graph = tiny_decoder(variant)
    limits = ShapeLimits(**(shapes or TINY_SHAPES))
    return TensorRTPrimitives.stand_in(graph, build_verify_graph(cfg.vocab, 16), limits, eos=cfg.eos, top_k_limit=16, max_rows_per_pass=limits.max_lanes * limits.rows_per_lane * 2)


SPEC_PROMPTS = [[10, 11, 12, 13, 10, 11, 12], [7, 8, 9, 7, 8, 9, 7], [100, 200, 30, 40, 100, 200], [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]]


# -- the device: TensorRT, a GPU, engines ------------------------------------------------------


def environment() -> tuple[Any, dict]:
    """``(tensorrt, the versions found)`` (:data:`ENVIRONMENT_KEYS`), or :class:`Missing` saying in
    one line what is missing or mismatched."""
    from sf_trt.backends.tensorrt import TensorRTUnavailable
    from sf_trt.backends.tensorrt.probes import cuda_mismatch, device_info, import_tensorrt, onnxruntime_distributions, stack_versions

    try:
        trt = import_tensorrt()
    except TensorRTUnavailable as exc:
        raise Missing(f"{exc} (this check needs TensorRT, pip install -e '.[gpu-cu12]' or '.[gpu-cu13]', and an NVIDIA GPU)") from None
    try:
        import torch
    except ImportError as exc:
        raise Missing(f"torch is not installed ({exc}); the TensorRT backend keeps its buffers in torch CUDA tensors") from None
    if not torch.cuda.is_available():
        raise Missing(f"TensorRT {trt.__version__} is installed but torch sees no CUDA GPU")
    try:
        device_info()
    except TensorRTUnavailable as exc:
        raise Missing(f"TensorRT {trt.__version__} is installed but {exc}") from None
    versions = stack_versions(trt)
    mismatch = cuda_mismatch(versions)
    if mismatch:
        raise Missing(f"{mismatch} ({versions.line()})")
    wheels = onnxruntime_distributions()
    if len(wheels) > 1:
        raise Missing(f"{' and '.join(wheels)} are both installed and write the same package: keep one (docs/tensorrt.md, 'Install')")
    return trt, {**versions.to_json(), "onnxruntime": wheels}


class Engines:
    """Builds engines on demand, one directory per graph, shapes and TensorRT version, and remembers them."""

    def __init__(self, root: Path, tensorrt_version: str) -> None:
        self.root, self.version = root, tensorrt_version
        self.built: list[str] = []

    def build(self, name: str, graph, shapes: dict, *, key: str | None = None) -> Path:
        """An engine directory holding ``name`` built from ``graph`` (a model, or an ONNX path
        whose digest is ``key``) at ``shapes``."""
        import onnx

        from sf_trt.export.trt_build import build_engine
        from sf_trt.export.trt_config import BuildConfig
        from sf_trt.formats.manifest import read_manifest

        data = key.encode() if key is not None else graph.SerializeToString()
        digest = hashlib.sha256(data + json.dumps([shapes, self.version], sort_keys=True).encode()).hexdigest()[:12]
        out = self.root / f"{name}-{digest}"
        if (out / "manifest.json").exists() and name in read_manifest(out):
            return out
        out.mkdir(parents=True, exist_ok=True)
        path = graph
        if key is None:
            path = out / f"{name}.onnx"
            onnx.save(graph, path)
        build_engine(path, BuildConfig(**shapes, timing_cache=str(self.root / "timing.cache")), out, name=name, log=lambda s: None)
        self.built.append(out.name)
        return out

    def merged(self, *dirs: Path) -> Path:
        """One directory whose manifest names the engines of all ``dirs``."""
        import shutil

        from sf_trt.formats.manifest import read_manifest, write_manifest

        both = self.root / "+".join(d.name for d in dirs)
        if not (both / "manifest.json").exists():
            both.mkdir(parents=True, exist_ok=True)
            for d in dirs:
                for entry in read_manifest(d).values():
                    shutil.copy2(d / entry.engine_file, both / entry.engine_file)
                    write_manifest(both, entry)
        return both


def trt_runner(trt, engine_dir: Path, name: str):
    """A TrtRunner of engine ``name`` and a function feeding it host arrays, returning host arrays."""
    import torch

    from sf_trt.backends.tensorrt.buffers import BufferPlan, numpy_dtype
    from sf_trt.backends.tensorrt.device import TorchDevice
    from sf_trt.backends.tensorrt.probes import start_tensorrt
    from sf_trt.backends.tensorrt.runners import TrtRunner
    from sf_trt.formats.manifest import read_manifest

    entry = read_manifest(engine_dir)[name]
    dev = TorchDevice(torch, 0)
    plan = BufferPlan.from_manifest(entry)
    with dev.current():
        runner = TrtRunner(trt, start_tensorrt(trt, "Runtime", trt.Logger(trt.Logger.WARNING)), name, (engine_dir / entry.engine_file).read_bytes(), plan, dev)

    def run(feeds: dict) -> dict:
        dev_feeds = {b.name: dev.to_device(np.asarray(feeds[b.name]).astype(numpy_dtype(b.dtype))) for b in plan.inputs()}
        return {k: dev.to_host(v) for k, v in runner.run(dev_feeds).items()}

    return runner, run


INT_CASES = [(18542495, 32), (2147483647, 32), (1800000000, 32), (5950571286963681280, 196613), (2**62 + 12345, 1000003), (2**40 + 7, 3)]
"""NVIDIA/TensorRT#4702 (x % 32), Torch-TensorRT#3230 (a large int64 % 196613), and more above 2**24."""


def int_operands(rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """``(pairs [n, 2] int64, how many have power-of-two divisors, how many are below 2**24)``:
    dividends below 2**24 over divisors ``2**0 .. 2**12`` (4096 and 2 are what sf_trt's graphs
    divide by), then over other divisors up to 4097, then :data:`INT_CASES` (up to 2**62)."""
    pow2 = np.stack([rng.integers(0, 2**24, 2048), 2 ** rng.integers(0, 13, 2048)], axis=1)
    pow2[:4] = [[2**24 - 1, 1], [2**24 - 1, 4096], [16773118, 4096], [0, 2]]
    other = np.stack([rng.integers(0, 2**24, 2048), rng.integers(3, 4098, 2048)], axis=1)
    other[:, 1] += (other[:, 1] & (other[:, 1] - 1)) == 0  # no power of two here (3..4097 -> odd neighbours)
    other[1024:, 0] = other[1024:, 1] * (other[1024:, 0] // other[1024:, 1])  # exact multiples: where a reciprocal rounds down
    other[:2] = [[2**24 - 1, 3], [18542495 % 2**24, 4095]]
    pairs = np.concatenate([pow2, other, np.array(INT_CASES, np.int64)]).astype(np.int64)
    return pairs, len(pow2), len(pow2) + len(other)


def judge_int_division(pairs: np.ndarray, n_pow2: int, n_small: int, mod: np.ndarray, div: np.ndarray) -> dict:
    """Which engine results differ from Python's integers (floor division, Mod with fmod=0), by
    group: ``pow2`` (below 2**24, power-of-two divisors: must be exact), ``other`` (below 2**24,
    other divisors: reported), ``wide`` (up to 2**62: reported). Each group: ``{"pairs", "wrong",
    "examples"}``."""
    out = {}
    for group, lo, hi in (("pow2", 0, n_pow2), ("other", n_pow2, n_small), ("wide", n_small, len(pairs))):
        wrong = []
        for i in range(lo, hi):
            a, b = int(pairs[i, 0]), int(pairs[i, 1])
            if int(mod[i]) != a % b or int(div[i]) != a // b:
                wrong.append(f"{a} % {b} -> {int(mod[i])} (want {a % b}), // -> {int(div[i])} (want {a // b})")
        out[group] = {"pairs": hi - lo, "wrong": len(wrong), "examples": wrong[:3]}
    return out


def int_division_rows(judged: dict) -> list[tuple[str, str, str]]:
    """``(status, check, detail)`` rows of (a) from :func:`judge_int_division`'s result: FAIL when a
    power-of-two divisor below 2**24 went wrong; the other groups are NOTEs either way."""
    p, o, w = judged["pow2"], judged["other"], judged["wide"]
    rows_ = [(
        "FAIL" if p["wrong"] else "PASS", "int64 Mod/Div below 2**24, power-of-two divisors (sf_trt's graphs rely on it)",
        f"{p['wrong']} of {p['pairs']} pairs wrong, e.g. {p['examples'][0]}" if p["wrong"] else f"{p['pairs']} pairs exact",
    )]
    rows_.append(("NOTE", "int64 Mod/Div below 2**24, other divisors (only the copy-model fake divides so)",
                  f"{o['wrong']} of {o['pairs']} wrong (a division through a float32 reciprocal gets exact multiples wrong), e.g. {o['examples'][0]}" if o["wrong"] else f"all {o['pairs']} exact"))
    rows_.append(("NOTE", "int64 Mod/Div up to 2**62 (NVIDIA/TensorRT#4702)",
                  f"{w['wrong']} of {w['pairs']} wrong, e.g. {w['examples'][0]}: sf_trt's graphs keep every integer below 2**24" if w["wrong"] else f"all {w['pairs']} exact"))
    return rows_


def int_division(trt, engines: Engines) -> dict:
    """(a): one-node int64 Mod (fmod=0) and Div engines on :func:`int_operands`, judged by
    :func:`judge_int_division`."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    from sf_trt.export.trt_build import serialize_engine, settings_for
    from sf_trt.export.trt_config import build_settings
    from sf_trt.formats.shapes import ShapeLimits, onnx_io

    pairs, n_pow2, n_small = int_operands(np.random.default_rng(24))
    n = len(pairs)
    vi = lambda name: h.make_tensor_value_info(name, T.INT64, ["rows"])  # noqa: E731
    graph = h.make_graph(
        [h.make_node("Mod", ["a", "b"], ["mod"], name="mod", fmod=0), h.make_node("Div", ["a", "b"], ["div"], name="div")],
        "int_division", [vi("a"), vi("b")], [vi("mod"), vi("div")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    out = engines.root / "int_division"
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "int_division.onnx")
    # Not through build_engine: its check refuses exactly this (an unbounded integer Mod).
    settings = settings_for(trt, build_settings("graph", "fp32", onnx_io(model), ShapeLimits(max_lanes=1, rows_per_lane=n, max_context=1), trt.__version__))
    engine = out / "int_division.engine"
    engine.write_bytes(serialize_engine(trt, out / "int_division.onnx", settings))

    import torch

    from sf_trt.backends.tensorrt.buffers import BufferPlan
    from sf_trt.backends.tensorrt.device import TorchDevice
    from sf_trt.backends.tensorrt.probes import start_tensorrt
    from sf_trt.backends.tensorrt.runners import TrtRunner

    dev = TorchDevice(torch, 0)
    plan = BufferPlan.from_io("int_division", onnx_io(model), settings.profiles[0].max_dims())
    with dev.current():
        runner = TrtRunner(trt, start_tensorrt(trt, "Runtime", trt.Logger(trt.Logger.WARNING)), "int_division", engine.read_bytes(), plan, dev)
    got = runner.run({"a": dev.to_device(pairs[:, 0]), "b": dev.to_device(pairs[:, 1])})
    mod, div = dev.to_host(got["mod"]), dev.to_host(got["div"])
    return judge_int_division(pairs, n_pow2, n_small, mod, div)


def trt_prims(engine_dir: Path, model: str, eos: int, *, cuda_graphs: bool = False, **caps):
    from sf_trt.backends.tensorrt import TensorRTPrimitives

    return TensorRTPrimitives.open(engine_dir, model=model, verify="verify", eos=eos, cuda_graphs=cuda_graphs, **caps)


def tiny_engines(engines: Engines, precision: str) -> tuple[Any, Path]:
    from sf_trt.graphs.verify import build_verify_graph

    cfg, graph = tiny_decoder(precision)
    dec = engines.build("decoder", graph, TINY_SHAPES)
    ver = engines.build("verify", build_verify_graph(cfg.vocab, 16), TINY_SHAPES)
    return cfg, engines.merged(dec, ver)


def fake_dir(engines: Engines, cfg) -> Path:
    from sf_trt.graphs.verify import build_verify_graph

    copy = engines.build("copy_model", copy_graph(cfg), fake_shapes(cfg))
    ver = engines.build("verify", build_verify_graph(cfg.vocab, min(cfg.top_k_limit, cfg.vocab)), fake_shapes(cfg))
    return engines.merged(copy, ver)


@dataclasses.dataclass
class RealModel:
    """The real model: its fp32 export (onnxruntime's reference) and fp16 engines."""

    fp32_dir: Path
    engine_dir: Path
    eos: int
    prompts: list[tuple[str, list[int]]]


def real_model(engines: Engines, gguf: Path | None) -> RealModel:
    from sf_trt.export.pipeline import default_model_dir, export_model_dir
    from sf_trt.formats.model_dir import GRAPH_FILE, VERIFY_FILE, ModelDir
    from sf_trt.tokenizer import Tokenizer

    import precision_agreement

    if gguf is None:
        try:  # never fetched: a device machine may have no network
            dirs = {p: default_model_dir(progress=False, download=False, weight_dtype="float32", precision=p) for p in ("fp32", "fp16")}
        except Exception as exc:
            raise AssertionError(f"no local copy of the default model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); pass --gguf PATH") from None
    else:
        dirs = {p: export_model_dir(gguf, engines.root / f"model-{p}", progress=False, weight_dtype="float32", precision=p) for p in ("fp32", "fp16")}
    fp16 = ModelDir.open(dirs["fp16"])
    key = fp16.meta["config_sha256"]
    dec = engines.build("decoder", fp16.path / GRAPH_FILE, REAL_SHAPES, key=key)
    ver = engines.build("verify", fp16.path / VERIFY_FILE, REAL_SHAPES, key=key + "/verify")
    prompts = precision_agreement.bench_prompt_ids(Tokenizer.load(dirs["fp32"]))
    return RealModel(Path(dirs["fp32"]), engines.merged(dec, ver), fp16.config.eos, prompts)


def real_agreement(m: RealModel, max_tokens: int):
    import precision_agreement

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    context = max(len(p) for _, p in m.prompts) + max_tokens + 1
    with OrtDecoderPrimitives(m.fp32_dir, max_lanes=1, max_context=context) as ref:
        cand = trt_prims(m.engine_dir, "decoder", m.eos)
        rows_ = precision_agreement.agreement(ref, cand, m.prompts, max_tokens)
        cand.close()
    s = precision_agreement.summary(rows_)
    detail = (f"teacher-forced top-1 {s['forced_matches']}/{s['tokens']} = {100 * s['forced_agreement']:.2f}%, "
              f"{s['identical_outputs']} of {s['prompts']} greedy outputs identical ({s['identical_prefix_tokens']} tokens before a first difference)")
    if s["forced_agreement"] < AGREEMENT_FLOOR:
        raise AssertionError(f"{detail}; expected at least {100 * AGREEMENT_FLOOR:.0f}% teacher-forced")
    return detail, {"rows": [r.to_json() for r in rows_], "summary": s}


AGREEMENT_FLOOR = 0.97
"""Teacher-forced top-1 agreement of TensorRT fp16 with onnxruntime fp32 below which (d) fails.
onnxruntime's own fp16 against its fp32 agrees on 100% of the bench prompts' tokens (docs/tensorrt.md)."""


def real_requests(m: RealModel, max_tokens: int, *, sampled: bool, speculate: bool):
    from sf_trt.abi import Sampling, SamplingParams
    from sf_trt.generate import Request

    mode = Sampling.GPU_GUMBEL if sampled else Sampling.GPU_GREEDY
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95) if sampled else SamplingParams(max_tokens=max_tokens)
    return [Request(p, mode, params, seed=1000 + i, speculate=speculate) for i, (_, p) in enumerate(m.prompts)]


def real_speculation(m: RealModel, max_tokens: int) -> str:
    from sf_trt.generate import Generator
    from sf_trt.scheduler import DraftPolicy

    prims = trt_prims(m.engine_dir, "decoder", m.eos, cuda_graphs=True)
    gen, notes = Generator(prims, policy=DraftPolicy()), []  # every lane drafts: the check needs drafts in every pass
    for sampled in (False, True):
        plain = gen.run(real_requests(m, max_tokens, sampled=sampled, speculate=False))
        spec = gen.run(real_requests(m, max_tokens, sampled=sampled, speculate=True))
        differ = [pid for (pid, _), a, b in zip(m.prompts, plain, spec) if a.tokens != b.tokens]
        if differ:
            raise AssertionError(f"{'sampled' if sampled else 'greedy'}: speculative differs from plain on {differ}")
        notes.append(f"{'sampled' if sampled else 'greedy'}: {sum(r.accepted for r in spec)}/{sum(r.proposed for r in spec)} drafts taken")
    prims.close()
    return f"{len(m.prompts)} prompts x 2 modes, {max_tokens} tokens, 4 lanes: speculative == plain ({'; '.join(notes)})"


def real_throughput(m: RealModel, max_tokens: int):
    from sf_trt.generate import Generator
    from sf_trt.scheduler import DraftPolicy

    prims = trt_prims(m.engine_dir, "decoder", m.eos, cuda_graphs=True)
    gen = Generator(prims, policy=DraftPolicy())  # the load-aware policy's row costs are the CPU's; a GPU verifies rows almost free
    gen.run(real_requests(m, 8, sampled=False, speculate=False)[:1])  # warm up (and capture the CUDA graphs)
    out = {}
    for label, speculate in (("plain", False), ("spec", True)):
        t0 = time.perf_counter()
        results = gen.run(real_requests(m, max_tokens, sampled=False, speculate=speculate))
        out[label] = sum(len(r.tokens) for r in results) / (time.perf_counter() - t0)
    prims.close()
    detail = f"{len(m.prompts)} bench prompts, 4 lanes, greedy, {max_tokens} tokens: plain {out['plain']:.0f} tok/s, speculative {out['spec']:.0f} tok/s"
    return detail, out


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Exit status: 0 every check asked for passed; 1 a row failed or a check did not pass; "
        "2 TensorRT, torch with CUDA or a GPU is missing, or the stack's CUDA majors disagree.",
    )
    ap.add_argument("--out", type=Path, default=Path(".trt_device_check"), help="engine cache directory (default .trt_device_check/)")
    ap.add_argument("--json", type=Path, default=Path("trt_device_check.json"), help="where the rows go (default trt_device_check.json)")
    ap.add_argument("--gguf", type=_local_file, default=None,
                    help="the real model's GGUF, a local file (default: SmolLM2-135M-Instruct from sf_trt's cache; never fetched)")
    ap.add_argument("--skip-real", action="store_true", help="leave out (d), (f) and (h), the real model (the JSON then says complete: false)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per bench prompt in (d) and (f) (default 64)")
    args = ap.parse_args(argv)
    if args.max_tokens < 1:
        ap.error(f"argument --max-tokens: {args.max_tokens} must be >= 1")
    return args


def _local_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not a local file (the device check never fetches)")
    return path


def requested_checks(args: argparse.Namespace) -> list[str]:
    """The checks of :data:`CHECKS` this run must pass: all, or all but the real model's."""
    return [c for c in CHECKS if not (args.skip_real and c in REAL_CHECKS)]


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        trt, env = environment()
    except Missing as exc:
        print(f"trt_device_check: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    engines, table = Engines(args.out, trt.__version__), Table()
    print(f"trt_device_check: {env}", flush=True)

    def add(status: str, rid: str, check: str, detail: str, data: Any = None) -> None:
        table.rows.append(Row(rid, check, status, 0.0, detail, data))

    judged = table.run("a", "int64 Mod/Div engines built and run", lambda: ("built and run", int_division(trt, engines)))
    if judged is not None:
        for k, (status, check, detail) in enumerate(int_division_rows(judged)):
            add(status, "a", check, detail, judged if k == 0 else None)

    def verify_check():
        from sf_trt.graphs.verify import build_verify_graph

        shapes = dict(max_lanes=8, rows_per_lane=8, max_context=1)
        debug = engines.build("verify_debug", build_verify_graph(VERIFY_VOCAB, VERIFY_TOP_K, debug=True), shapes)
        plain = engines.build("verify", build_verify_graph(VERIFY_VOCAB, VERIFY_TOP_K), shapes)
        _, run_debug = trt_runner(trt, debug, "verify_debug")
        _, run_plain = trt_runner(trt, plain, "verify")
        return verify_against_reference(run_debug, run_plain, 64, VERIFY_VOCAB, VERIFY_TOP_K)

    table.run("b", "verify engine: u == hash_u, tokens == reference", verify_check)
    tiny_dirs: dict = {}
    for variant in TINY_VARIANTS:
        def packing_check(variant=variant):
            cfg, engine_dir = tiny_engines(engines, variant)
            tiny_dirs[variant] = (cfg, engine_dir)
            return packing(lambda: trt_prims(engine_dir, "decoder", cfg.eos), cfg.vocab)

        table.run("c", f"packing, tiny decoder {variant}: alone == packed", packing_check)
        if variant in tiny_dirs:
            cfg, engine_dir = tiny_dirs[variant]
            table.run("c", f"tiny decoder {variant} vs onnxruntime", lambda: close_to_reference(
                lambda: trt_prims(engine_dir, "decoder", cfg.eos), lambda: tiny_stand_in("fp32" if variant == "bf16" else variant),
                cfg.vocab, CLOSE_TO_ORT[variant]))

    holder: dict = {}  # the real model, once exported and built
    if args.skip_real:
        add("NOTE", "d", "real model", "skipped (--skip-real): (d), (f) and (h) not run; the run is not complete")
    else:
        def load_real():
            holder["m"] = real_model(engines, args.gguf)
            return f"SmolLM2 fp16 engines at {REAL_SHAPES}"

        table.run("d", "real model: export fp16 from a local GGUF, build engines", load_real)
        if "m" in holder:
            m = holder["m"]
            table.run("d", "real model fp16 vs onnxruntime fp32, greedy", lambda: real_agreement(m, args.max_tokens))
            table.run("d", "real model fp16: speculative == plain", lambda: real_speculation(m, args.max_tokens))
            table.run("h", "full-shape 8 x 16 engine: every slot == the row alone", lambda: full_shape_rows(
                lambda: trt_prims(m.engine_dir, "decoder", m.eos), m.prompts[0][1][:24], [t for _, p in m.prompts[1:] for t in p][:REAL_SHAPES["rows_per_lane"]]))

    def replay_check():
        cfg, engine_dir = tiny_dirs.get("fp16") or tiny_engines(engines, "fp16")
        return replay_equals_eager(lambda graphs: trt_prims(engine_dir, "decoder", cfg.eos, cuda_graphs=graphs), cfg.vocab)

    table.run("e", "CUDA-graph replay == eager, graphs captured", replay_check)
    if "m" in holder:
        table.run("f", "tokens/s, real model fp16", lambda: real_throughput(holder["m"], 2 * args.max_tokens))

    def seed_check():
        from sf_trt.backends.tensorrt import TensorRTPrimitives
        from sf_trt.fake import FakeConfig

        def trt_fake(cfg=FakeConfig()):
            return TensorRTPrimitives.fake(fake_dir(engines, cfg), cfg, cuda_graphs=True)

        return seed_contract(trt_fake, "the TensorRT fake")

    table.run("g", "seed contract on the TensorRT fake", seed_check)
    add("NOTE", "-", "engines built this run", ", ".join(engines.built) or "(all cached)")
    return finish(table, env, requested_checks(args), args.json)


def finish(table: Table, env: dict, requested: list[str], json_path: Path) -> int:
    """Print the table, write the JSON (and the tracebacks); the exit status :func:`verdict` gives."""
    table.print()
    report = table.to_json(env, requested)
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if table.logs:
        json_path.with_suffix(".log").write_text("\n".join(table.logs))
    print(f"\nrows: {json_path}" + (f"; tracebacks: {json_path.with_suffix('.log')}" if table.logs else ""))
    if not report["passed"]:
        print(f"trt_device_check: not passed: {', '.join(f'({c}) {CHECKS[c]}' for c in report['not_passed']) or 'a row failed'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
