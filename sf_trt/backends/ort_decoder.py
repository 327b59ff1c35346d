"""A Llama decoder on onnxruntime behind the Primitives protocol.

The graph is :func:`export.decoder.build_decoder_graph` (read from a model
directory written by :func:`export.decoder.export_model_dir`); its docstring
says why every row of a pass comes out bit-identical whatever else shares the
pass. This module packs the protocol's flat rows into the graph's ``[B, T]``
layout and keeps the KV cache on the host:

* the cache is two numpy arrays ``[n_layers, max_lanes, n_kv_heads,
  max_context + 1, head_dim]`` float32 (position ``max_context`` of each lane is
  the trash slot padding rows write to), allocated once. A run's lanes are
  sorted by slot; when their slots are contiguous (the usual case: keep a
  batch's lanes in slots ``0..n-1``) each layer's input is an OrtValue over a
  view of the arrays, made once per slot range and bound with IOBinding, so a
  pass reads the cache in place; otherwise their rows are copied out first
  (``cache_copies`` counts those runs);
* the graph returns only this pass's new K/V; after the pass they are written
  into the arrays at ``(slot, position)`` (numpy bookkeeping), padding rows
  skipped;
* rollback is a length: ``truncate`` only moves ``state_len`` (PrimitivesBase
  keeps it); entries past it are masked by position and overwritten later::

      lane slot  [0 ........ state_len) [state_len ... old end) [ ... ) [trash]
                  read by attention       dead: masked, rewritten          padding

Packing: a pass's rows are grouped by lane (order kept); each lane is one row of
``[B, T]``, padded to the pass's longest lane with position ``max_context``.
Because rows do not depend on what shares their pass, a forward call may run
its lanes as several graph runs: lanes whose row counts differ a lot (a 256-row
prefill beside 1-row decodes) go to separate runs when padding them together
would cost more than another pass over the weights (:meth:`_plan_runs`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..abi import Status, StatusError
from ..primitives import Capabilities, PrimitivesBase, Rows, SampleRows

__all__ = ["OrtDecoderPrimitives", "OPTIMIZATION_LEVELS"]

OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def _bad(what: str) -> StatusError:
    return StatusError(Status.BAD_ARGUMENT, f"OrtDecoderPrimitives: {what}")


class OrtDecoderPrimitives(PrimitivesBase):
    """The exported decoder in ``model_dir`` on onnxruntime.

    ``max_lanes`` cache slots of ``max_context`` positions each (at most the
    model's context length); ``threads``: onnxruntime's intra-op threads (None:
    its default, one per core); ``max_rows_per_pass``: the most rows one forward
    call takes; ``providers``: onnxruntime execution providers (default CPU; the
    host-side cache and IOBinding are written for the CPU provider);
    ``optimization``: onnxruntime's graph optimization level, one of
    :data:`OPTIMIZATION_LEVELS` (all of them keep rows exact; see
    ``tests/test_row_independence.py``); ``pass_cost_rows``: how many rows of
    padding one extra graph run is worth (packing heuristic, never exactness);
    ``cache_inputs``: which graph form to run (``"pass"``, or ``"slots"`` for
    comparison).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        max_lanes: int = 4,
        max_context: int = 2048,
        threads: int | None = None,
        max_rows_per_pass: int = 512,
        *,
        providers: Sequence | None = None,
        optimization: str = "all",
        top_k_limit: int = 1024,
        pass_cost_rows: int = 12,
        sampler_threads: int = 1,
        cache_inputs: str = "pass",
    ) -> None:
        import onnxruntime as ort

        from sf_trt.export.decoder import CACHE_INPUTS, GRAPH_FILE, PASS_GRAPH_FILE, read_model_dir
        from sf_trt.export.gguf_llama import LlamaConfig

        self.model_dir = Path(model_dir)
        try:
            meta = read_model_dir(self.model_dir)
        except ValueError as exc:
            raise _bad(str(exc)) from None
        cfg = LlamaConfig.from_dict(meta["llama"])
        max_positions = int(meta["graph"].get("max_positions", cfg.context_length))
        if not 1 <= max_lanes:
            raise _bad(f"max_lanes must be >= 1 (got {max_lanes})")
        if not 2 <= max_context <= max_positions:
            raise _bad(f"max_context {max_context} outside 2..{max_positions} (the model's context length)")
        if max_rows_per_pass < 1:
            raise _bad(f"max_rows_per_pass must be >= 1 (got {max_rows_per_pass})")
        if cache_inputs not in CACHE_INPUTS:
            raise _bad(f"cache_inputs {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
        if optimization not in OPTIMIZATION_LEVELS:
            raise _bad(f"optimization {optimization!r} unknown (known: {', '.join(OPTIMIZATION_LEVELS)})")
        top_k_limit = min(int(top_k_limit), cfg.vocab)
        super().__init__(
            Capabilities(
                vocab=cfg.vocab, eos=cfg.eos, max_lanes=int(max_lanes), max_context=int(max_context),
                max_rows_per_pass=int(max_rows_per_pass), verify_rows=True, truncate_partial=True,
                kernel_capabilities=0, top_k_limit=top_k_limit,
            )
        )
        self.config = cfg
        self.meta = meta
        self.pass_cost_rows = int(pass_cost_rows)
        self.runs = 0
        """Graph runs so far (a forward call may make several)."""

        opts = ort.SessionOptions()
        if threads is not None:
            opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[optimization]
        self.providers = list(providers) if providers else ["CPUExecutionProvider"]
        self.weight_dtype = meta.get("weights", "float32")
        if self.weight_dtype == "int8":
            # DequantizeLinear -> MatMul is fused into onnxruntime's 8-bit kernel only from
            # ORT_ENABLE_EXTENDED up; unfused, the matmul's right operand is computed per pass
            # and MLAS's M == 1 path would make rows depend on the pass. Level 4 (int8
            # compute, activations quantized per row and block) is the fast, row-exact one.
            if optimization in ("disable", "basic"):
                raise _bad(f"optimization {optimization!r} with int8 weights: rows would not be exact (use 'extended' or 'all')")
            opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "4")
        self.cache_inputs = cache_inputs
        graph_file = PASS_GRAPH_FILE if cache_inputs == "pass" else GRAPH_FILE
        self._session = ort.InferenceSession(str(self.model_dir / graph_file), opts, providers=self.providers)

        # The KV cache, host side, allocated once. A run binds views of it.
        shape = (cfg.n_layers, self.capabilities.max_lanes, cfg.n_kv_heads, max_context + 1, cfg.head_dim)
        self._keys = np.zeros(shape, np.float32)
        self._values = np.zeros(shape, np.float32)
        self._binding = self._session.io_binding()
        self._ort = ort
        self._views: dict[tuple[int, int], list] = {}  # (first slot, lanes) -> OrtValues of that range
        self._bound: tuple[int, int] | None = None
        self._staged: list | None = None
        self.cache_copies = 0
        """Runs whose lanes' slots were not contiguous, so their caches were copied."""
        if cache_inputs == "slots":  # the whole cache, bound once; the graph gathers the lanes
            self._bind_range(0, self.capabilities.max_lanes)

        self.tokenizer = None
        if (self.model_dir / "tokenizer.json").is_file():
            from ..tokenizer import Tokenizer

            self.tokenizer = Tokenizer.load(self.model_dir)
        from ..sampler import OrtVerifySampler

        self._sampler = OrtVerifySampler(cfg.vocab, top_k_limit=top_k_limit, threads=int(sampler_threads))

    # -- the protocol ------------------------------------------------------------

    def _forward_impl(self, rows: Rows) -> np.ndarray:
        self._check_open()
        vocab = self.capabilities.vocab
        # each wanted row once (logit_rows may name a row twice)
        unique_rows, inverse = np.unique(rows.logit_rows, return_inverse=True)
        logits = np.empty((unique_rows.shape[0], vocab), np.float32)
        if rows.num_rows == 0:
            return logits[inverse]
        # group rows by lane, lanes in order of first appearance
        lane_order, first = np.unique(rows.lanes, return_index=True)
        lane_order = lane_order[np.argsort(first, kind="stable")]
        lane_rows = [np.flatnonzero(rows.lanes == lane) for lane in lane_order]
        wanted = np.full(rows.num_rows, -1, np.int64)  # row -> its place in logit_rows
        wanted[unique_rows] = np.arange(unique_rows.shape[0])
        for group in self._plan_runs([r.shape[0] for r in lane_rows]):
            self._run(rows, [lane_order[j] for j in group], [lane_rows[j] for j in group], wanted, logits)
        return logits if unique_rows.shape[0] == inverse.shape[0] and np.all(inverse == np.arange(inverse.shape[0])) else logits[inverse]

    def _verify_sample_impl(self, logits: np.ndarray, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        self._check_open()
        return self._sampler.run(logits, sample)

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # the length is the state: entries past it are masked, then overwritten

    def close(self) -> None:
        self._binding = None
        self._views = {}
        self._staged = None
        self._session = None
        self._sampler = None
        self._keys = self._values = None

    # -- passes --------------------------------------------------------------------

    def _plan_runs(self, counts: list[int]) -> list[list[int]]:
        """Lanes (indices into ``counts``) per graph run, minimising
        ``runs * pass_cost_rows + padded rows`` over groups of lanes adjacent in
        row-count order (exact DP; a handful of lanes)."""
        order = sorted(range(len(counts)), key=lambda j: -counts[j])
        n = len(order)
        best = [0] + [None] * n
        cut = [0] * (n + 1)
        for end in range(1, n + 1):
            for start in range(end):
                cost = best[start] + self.pass_cost_rows + (end - start) * counts[order[start]]
                if best[end] is None or cost < best[end]:
                    best[end], cut[end] = cost, start
        groups = []
        end = n
        while end:
            groups.append(sorted(order[cut[end]:end]))  # keep first-appearance order inside a run
            end = cut[end]
        return groups[::-1]

    def _bind_range(self, first: int, n: int) -> None:
        values = self._views.get((first, n))
        if values is None:
            values = self._views[(first, n)] = [
                self._ort.OrtValue.ortvalue_from_numpy(arr[i, first:first + n])
                for i in range(self.config.n_layers)
                for arr in (self._keys, self._values)
            ]
        for i in range(self.config.n_layers):
            self._binding.bind_ortvalue_input(f"past_key_{i}", values[2 * i])
            self._binding.bind_ortvalue_input(f"past_value_{i}", values[2 * i + 1])
        self._bound = (first, n)

    def _bind_caches(self, slots: np.ndarray) -> None:
        """Bind past_key_i / past_value_i to the caches of ``slots`` (ascending)."""
        if self.cache_inputs == "slots":
            self._binding.bind_cpu_input("lane_ids", slots)
            return
        first, n = int(slots[0]), int(slots.shape[0])
        if int(slots[-1]) - first + 1 == n:  # contiguous: a view
            if self._bound != (first, n):
                self._bind_range(first, n)
            return
        self.cache_copies += 1
        keys, vals = self._keys[:, slots], self._values[:, slots]  # copies
        self._staged = [self._ort.OrtValue.ortvalue_from_numpy(arr[i]) for i in range(self.config.n_layers) for arr in (keys, vals)]
        for i in range(self.config.n_layers):
            self._binding.bind_ortvalue_input(f"past_key_{i}", self._staged[2 * i])
            self._binding.bind_ortvalue_input(f"past_value_{i}", self._staged[2 * i + 1])
        self._bound = None

    def _run(self, rows: Rows, lanes: list[int], lane_rows: list[np.ndarray], wanted: np.ndarray, logits: np.ndarray) -> None:
        cfg, trash = self.config, self.capabilities.max_context
        order = np.argsort(np.asarray(lanes), kind="stable")  # lanes by slot: contiguous slots are a view
        slots = np.asarray(lanes, np.int64)[order]
        lane_rows = [lane_rows[j] for j in order]
        b, t = len(lanes), max(r.shape[0] for r in lane_rows)
        input_ids = np.zeros((b, t), np.int64)
        positions = np.full((b, t), trash, np.int64)
        flat = np.concatenate([j * t + np.arange(r.shape[0]) for j, r in enumerate(lane_rows)])  # [n] run row of each
        src = np.concatenate(lane_rows)  # [n] the pass's row index of each
        input_ids.reshape(-1)[flat] = rows.tokens[src]
        positions.reshape(-1)[flat] = rows.positions[src]
        keep = wanted[src] >= 0
        logit_index = np.ascontiguousarray(flat[keep])
        out_rows = wanted[src][keep]

        self._bind_caches(slots)
        bind = self._binding
        bind.bind_cpu_input("input_ids", input_ids)
        bind.bind_cpu_input("positions", positions)
        bind.bind_cpu_input("logit_index", logit_index)
        bind.bind_output("logits")
        bind.bind_output("new_kv")
        self._session.run_with_iobinding(bind)
        self.runs += 1
        run_logits, new_kv = (v.numpy() for v in bind.get_outputs())
        logits[out_rows] = run_logits
        # new_kv [n_layers, 2, B, T, nkv, hd] -> the cache at (slot, :, position, :)
        kv = new_kv.reshape(cfg.n_layers, 2, b * t, cfg.n_kv_heads, cfg.head_dim)[:, :, flat]
        row_slots = slots[flat // t]
        pos = rows.positions[src]
        self._keys[:, row_slots, :, pos, :] = kv[:, 0].transpose(1, 0, 2, 3)
        self._values[:, row_slots, :, pos, :] = kv[:, 1].transpose(1, 0, 2, 3)

    def _check_open(self) -> None:
        if self._session is None:
            raise StatusError(Status.UNSUPPORTED, "OrtDecoderPrimitives: used after close()")

    # -- for tests and tools ---------------------------------------------------------

    def cache_rows(self, lane: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of lane ``lane``'s K and V for its ``state_len`` positions,
        ``[n_layers, n_kv_heads, state_len, head_dim]`` each."""
        n = self.state_len(lane)
        return self._keys[:, lane, :, :n].copy(), self._values[:, lane, :, :n].copy()


# -- a quick benchmark: python -m sf_trt.backends.ort_decoder [--model-dir DIR] ----------------


def _bench(argv: Sequence[str] | None = None) -> None:
    """Passes/s of one lane at R rows per pass, and the prefill time, per context size."""
    import argparse
    import time

    ap = argparse.ArgumentParser(prog="python -m sf_trt.backends.ort_decoder", description=_bench.__doc__)
    ap.add_argument("--model-dir", help="an exported model directory (default: the default model, fetched and exported)")
    ap.add_argument("--int8", action="store_true", help="the default model with int8 weights")
    ap.add_argument("--contexts", default="512,2048", help="max_context values (comma-separated)")
    ap.add_argument("--rows", default="1,9", help="rows per decode pass (comma-separated)")
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--optimization", default="all", choices=OPTIMIZATION_LEVELS)
    args = ap.parse_args(argv)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        from ..models import default_model_dir

        model_dir = default_model_dir(weight_dtype="int8" if args.int8 else "float32")
    print(f"model {model_dir}  load average {os.getloadavg()[0]:.2f}  (best / median of {args.passes} passes)")

    def rows(start: int, tokens: np.ndarray, all_logits: bool) -> Rows:
        n = tokens.shape[0]
        wanted = np.arange(n) if all_logits else np.array([n - 1])
        return Rows(np.zeros(n, np.int64), np.arange(start, start + n, dtype=np.int64), tokens.astype(np.int64), wanted.astype(np.int64))

    tokens = np.random.default_rng(0).integers(100, 10000, max(args.prefill, 64))
    for ctx in (int(c) for c in args.contexts.split(",")):
        with OrtDecoderPrimitives(model_dir, max_lanes=1, max_context=ctx, threads=args.threads, optimization=args.optimization) as p:
            start = min(args.prefill, ctx - 64)
            p.forward(rows(0, tokens[:8], False))
            p.truncate(0, 0)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                p.forward(rows(0, tokens[:start], False))
                times.append(time.perf_counter() - t0)
                p.truncate(0, 0)
            print(f"max_context {ctx}: prefill {start} rows {min(times):.3f} s ({start / min(times):.0f} rows/s)")
            p.forward(rows(0, tokens[:start], False))
            for r in (int(x) for x in args.rows.split(",")):
                times = []
                for _ in range(args.passes):
                    t0 = time.perf_counter()
                    p.forward(rows(start, tokens[:r], True))
                    times.append(time.perf_counter() - t0)
                    p.truncate(0, start)
                best, med = min(times), float(np.median(times))
                print(f"  R={r:<3d} {1 / best:6.1f} passes/s best, {1 / med:6.1f} median ({best * 1e3:.1f} / {med * 1e3:.1f} ms)")


if __name__ == "__main__":
    _bench()
