"""A Llama decoder on onnxruntime behind the Primitives protocol.

The graph is the model directory's decoder (:mod:`sf_trt.formats.model_dir`),
built by ``sf_trt.export.decoder_graph``, whose docstring says why every row of
a pass comes out bit-identical whatever else shares the pass; on the CPU it is loaded in
onnxruntime's fused ops (:func:`loaded_graph`, :mod:`sf_trt.graphs.ort_fusions`). This module
packs the protocol's flat rows into the graph's ``[B, T]`` layout and keeps the KV cache on
the host:

* the cache is two lists of numpy arrays, one array per layer for K and one for V,
  ``[max_lanes, n_kv_heads, E, head_dim]`` of the decoder's compute type (float32, or
  float16 for an fp16 export), in small pages that are committed as positions are first
  written (:func:`lazy_zeros`). ``E``, the positions held per lane, follows what the lanes
  need: at the start of a forward call it grows to the call's largest position + 1 (its
  padding included) or the longest lane's length, rounded up to :data:`KEY_BLOCK`, and
  shrinks to that when it holds two blocks more (lanes that finished), by reallocating
  and copying the written positions one layer at a time (``cache_resizes`` counts it;
  position ``max_context``, reached only by padding rows, is the trash slot). Each lane
  slot's cache lives in one *row* of the arrays' lane axis, not necessarily its own: a run
  needs its lanes' rows side by side, so that each layer's input is an OrtValue
  over a view of the arrays (made once per row range, bound with IOBinding) and
  the pass reads the cache in place, at the arrays' length: the decoder graph's pass form
  reads its bound caches whole, their length its key extent (``sf_trt.export.decoder_graph``,
  *Key extent*), so that the only copy of the cache a pass makes is its ScatterND's. A run
  whose own extent is at most half the arrays' (a short lane beside a long one's run) is
  bound to a copy of its lanes' rows at its own extent instead (scratch buffers): the copy
  costs less than attending over the rest. When a run's lanes are not side by side
  (lanes finished or prefill apart from the others), the caches of the few lanes
  outside the best window are swapped into it, once, up to their lengths
  (``cache_moves`` counts the lanes moved); later runs of the same lanes find them
  in place. (Copying the run's caches out instead cost every pass a copy of them
  all: 17% of an 8-lane decode where two lanes were still prefilling.)
  The slots form (``cache_inputs="slots"``) holds the whole window, ``max_context + 1``
  positions, bound once;
* the graph returns only this pass's new K/V; after the pass they are written
  into the arrays at ``(slot, position)`` (numpy bookkeeping), padding rows
  skipped;
* a prefix from the prefix cache (:mod:`sf_trt.prefix_cache`) is copied into the
  lane's row (``load_prefix``), and blocks of a lane's positions are copied out into
  the block pool (``save_block``; :mod:`sf_trt.block_pool`, allocated once at the
  cache's budget): the rows then read it in place as if a prefill had written it;
* rollback is a length: ``truncate`` only moves ``state_len`` (PrimitivesBase
  keeps it); entries past it are masked by position and overwritten later::

      lane slot  [0 ........ state_len) [state_len ... old end) [ ... ) [trash]
                  read by attention       dead: masked, rewritten          padding

Packing: a pass's rows are grouped by lane (order kept); each lane is one row of
``[B, T]``, padded to the pass's longest lane at the positions after its last row
(capped at ``max_context``, the trash slot): padding is never visible to the lane's
real rows, and it keeps the run's key extent at what the pass's own positions need.
Because rows do not depend on what shares their pass, a forward call may run
its lanes as several graph runs: lanes whose row counts differ a lot (a 256-row
prefill beside 1-row decodes) go to separate runs when padding them together
would cost more than another pass over the weights (:meth:`_plan_runs`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..abi import Sampling, Status, StatusError
from ..block_pool import lazy_zeros
from ..formats.model_dir import CACHE_INPUTS, OUTPUTS, PASS_OUTPUTS, ModelDir, ModelDirError, cache_names
from ..primitives import Capabilities, PrimitivesBase, Rows, SampleRows
from .ort_adjust import HostLogitAdjust
from .ort_logprobs import HostLogprobs
from .ort_sampler import OrtVerifySampler
from .ort_session import OPTIMIZATION_LEVELS, open_session, providers_for

__all__ = ["OrtDecoderPrimitives", "OPTIMIZATION_LEVELS", "open_model", "lazy_zeros"]


_GREEDY = int(Sampling.GPU_GREEDY)

KEY_BLOCK = 64
"""The pass form's key extent ``E`` (the positions a run's caches are bound with) is the run's
largest position + 1 rounded up to a multiple of this, at most the window: a multiple of every
vector width onnxruntime's CPU kernels step by, so a row's real keys take the same vector path at
every extent (``sf_trt.export.decoder_graph``, *Key extent*), and a lane's growth reallocates
the host arrays once per this many positions."""

_CACHE_TYPES = {"fp32": np.float32, "fp16": np.float16}
"""The KV cache's numpy type by the decoder's precision, for the precisions onnxruntime runs."""


class PassLogits(np.ndarray):
    """Logits ``[K, vocab]`` float32 as a forward call returns them, with what the decoder graph
    computed beside them in the same run (the pass form's ``PASS_OUTPUTS``): ``greedy`` int64
    ``[K]``, each row's ArgMax (the lowest id on ties, as the verify graph's greedy rows); None
    when the graph has no such output. A greedy-only ``verify_sample`` then needs no sampler run.
    A copy (``.copy()``, slicing) drops it: only the array forward returned carries it."""

    greedy: np.ndarray | None = None

    @classmethod
    def empty(cls, rows: int, vocab: int, *, with_greedy: bool) -> "PassLogits":
        out = np.empty((rows, vocab), np.float32).view(cls)
        if with_greedy:
            out.greedy = np.empty(rows, np.int64)
        return out

    def rows(self, index: np.ndarray) -> "PassLogits":
        """The rows ``index`` (a copy), with their greedy tokens."""
        out = np.asarray(self)[index].view(PassLogits)
        if self.greedy is not None:
            out.greedy = self.greedy[index]
        return out


def _bad(what: str) -> StatusError:
    return StatusError(Status.BAD_ARGUMENT, f"OrtDecoderPrimitives: {what}")


def _check_graph_io(session, cfg, graph) -> None:
    """The decoder graph's caches and logits against config.json (a config edited and re-hashed to
    disagree with the graph is refused here, not by a failed run)."""
    caches = [i for i in session.get_inputs() if i.name.startswith(("past_key_", "past_value_"))]
    if len(caches) != 2 * cfg.n_layers:
        raise _bad(f"{graph}: {len(caches)} cache inputs, config.json's {cfg.n_layers} layers need {2 * cfg.n_layers}; re-export the model")
    for i in caches:
        dims = list(i.shape)
        if len(dims) != 4 or dims[1] != cfg.n_kv_heads or dims[3] != cfg.head_dim:
            raise _bad(f"{graph}: cache input {i.name} is {dims}, config.json says [*, {cfg.n_kv_heads}, *, {cfg.head_dim}]; re-export the model")
    logits = next((o for o in session.get_outputs() if o.name == OUTPUTS[0]), None)
    if logits is None or len(logits.shape) != 2 or logits.shape[1] != cfg.vocab:
        raise _bad(f"{graph}: logits {None if logits is None else list(logits.shape)}, config.json's vocabulary is {cfg.vocab}; re-export the model")


class OrtDecoderPrimitives(HostLogitAdjust, HostLogprobs, PrimitivesBase):
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
    comparison); ``spinning``: whether onnxruntime's intra-op threads spin between ops
    (False, the default, lets them sleep: on cores shared with other jobs a spinning thread
    that lost its core stalls the pass, and spinning burns CPU the other jobs could use;
    docs/benchmarks.md, issue 10). Neither changes any result.
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
        spinning: bool = False,
    ) -> None:
        try:
            model = ModelDir.open(model_dir)
        except ModelDirError as exc:
            raise _bad(str(exc)) from None
        cfg = model.config
        if model.precision not in _CACHE_TYPES:
            raise StatusError(
                Status.UNSUPPORTED,
                f"OrtDecoderPrimitives: {model.path} holds a {model.precision} decoder, which onnxruntime's CPU kernels do "
                f"not run (no bfloat16 MatMul); export it with --precision {' or '.join(_CACHE_TYPES)} for onnxruntime",
            )
        if not 1 <= max_lanes:
            raise _bad(f"max_lanes must be >= 1 (got {max_lanes})")
        if not 2 <= max_context <= model.max_positions:
            raise _bad(f"max_context {max_context} outside 2..{model.max_positions} (the model's context length)")
        if max_rows_per_pass < 1:
            raise _bad(f"max_rows_per_pass must be >= 1 (got {max_rows_per_pass})")
        if cache_inputs not in CACHE_INPUTS:
            raise _bad(f"cache_inputs {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
        if optimization not in OPTIMIZATION_LEVELS:
            raise _bad(f"optimization {optimization!r} unknown (known: {', '.join(OPTIMIZATION_LEVELS)})")
        top_k_limit = min(int(top_k_limit), cfg.vocab)
        kv_bytes = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * np.dtype(_CACHE_TYPES[model.precision]).itemsize
        super().__init__(
            Capabilities(
                vocab=cfg.vocab, eos=cfg.eos, max_lanes=int(max_lanes), max_context=int(max_context),
                max_rows_per_pass=int(max_rows_per_pass), verify_rows=True, truncate_partial=True,
                kernel_capabilities=0, top_k_limit=top_k_limit, logprobs=True, state_bytes_per_token=kv_bytes,
            )
        )
        self.model_dir = model.path
        self.config = cfg
        self.meta = model.meta
        self.pass_cost_rows = int(pass_cost_rows)
        self.runs = 0
        """Graph runs so far (a forward call may make several)."""
        self.providers = list(providers) if providers else ["CPUExecutionProvider"]
        self.weight_dtype = model.weights
        self.precision = model.precision
        self.cache_inputs = cache_inputs
        self.spinning = bool(spinning)
        self.graph = graph = model.graph_file(cache_inputs)
        """The decoder graph this backend runs."""
        config = self._session_config(optimization)
        try:
            self._session = open_session(loaded_graph(graph, self.providers, config), threads=threads, optimization=optimization, providers=self.providers, config=config)
        except Exception as exc:  # onnxruntime's own errors (InvalidProtobuf, Fail, ...) on a damaged or crafted graph
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise _bad(f"{graph}: onnxruntime cannot load it ({type(exc).__name__}: {first}); re-export the model") from None
        _check_graph_io(self._session, cfg, graph)
        graph_outputs = {o.name for o in self._session.get_outputs()}
        self._pass_outputs = set(PASS_OUTPUTS) <= graph_outputs  # the pass form's greedy tokens
        self._output_names = list(OUTPUTS) + (list(PASS_OUTPUTS) if self._pass_outputs else [])
        self._allocate_cache()
        self._sampler = OrtVerifySampler(cfg.vocab, top_k_limit=top_k_limit, threads=int(sampler_threads))

    # -- profiling hooks (tools/profile_decode.py, tools/bench_sampler.py) ----------------------

    def instrument(self, *, decoder_run: Optional[Callable[[Callable], Callable]] = None,
                   sampler_run: Optional[Callable[[Callable], Callable]] = None) -> None:
        """Wrap the decoder session's ``run_with_iobinding`` and the verify sampler's ``run``:
        each wrapper takes the callable and returns its stand-in (a timer, a recorder). What
        they return is what the pass uses, so a wrapper must call through."""
        if decoder_run is not None:
            self._session.run_with_iobinding = decoder_run(self._session.run_with_iobinding)
        if sampler_run is not None:
            self._sampler.run = sampler_run(self._sampler.run)

    def profile_passes(self, rows: Rows, passes: int, profile_prefix: str, threads: int | None = None) -> Path:
        """Run ``passes`` forward passes over ``rows`` on a profiling twin of the decoder
        session (onnxruntime's profiler on, ``profile_prefix`` for its file) and put the
        runtime session back; the profile file's path. The lanes' caches are written as by
        any pass."""
        optimization = "all"
        config = self._session_config(optimization)
        twin = open_session(loaded_graph(self.graph, ["CPUExecutionProvider"], config), threads=threads, config=config,
                            profile_prefix=profile_prefix)
        runtime = self._session
        self._session, self._binding, self._views, self._bound = twin, twin.io_binding(), {}, None
        try:
            for _ in range(passes):
                self._forward_impl(rows)
            return Path(twin.end_profiling())
        finally:
            self._session, self._binding, self._views, self._bound = runtime, runtime.io_binding(), {}, None

    def _session_config(self, optimization: str) -> dict[str, str]:
        spin = {"session.intra_op.allow_spinning": "1" if self.spinning else "0"}
        return {**spin, **self._exact_config(optimization)}

    def _exact_config(self, optimization: str) -> dict[str, str]:
        """The settings that keep rows exact at ``optimization`` (a refusal where none does)."""
        if self.precision == "fp16" and optimization != "all":
            # Measured (tests/backends/test_row_independence.py): below ORT_ENABLE_ALL an fp16
            # graph's matmuls run in forms whose row results depend on the rows beside them.
            raise _bad(f"optimization {optimization!r} with an fp16 decoder: rows would not be exact (use 'all')")
        if self.weight_dtype != "int8":
            return {}
        # DequantizeLinear -> MatMul is fused into onnxruntime's 8-bit kernel only from
        # ORT_ENABLE_EXTENDED up; unfused, the matmul's right operand is computed per pass
        # and MLAS's M == 1 path would make rows depend on the pass. Level 4 (int8
        # compute, activations quantized per row and block) is the fast, row-exact one.
        if optimization in ("disable", "basic"):
            raise _bad(f"optimization {optimization!r} with int8 weights: rows would not be exact (use 'extended' or 'all')")
        return {"session.qdq_matmulnbits_accuracy_level": "4"}

    def _allocate_cache(self) -> None:
        """The KV cache, host side; a run binds views of it. The slots form's is the whole window,
        allocated once; the pass form's holds the positions the lanes need (:meth:`_hold`)."""
        import onnxruntime as ort

        cfg, caps = self.config, self.capabilities
        self._dtype = _CACHE_TYPES[self.precision]
        self._extent = caps.max_context + 1 if self.cache_inputs == "slots" else 0
        """Positions the host arrays hold per lane: the key extent of the runs that bind them whole."""
        self._keys = [self._zeros(self._extent) for _ in range(cfg.n_layers)]  # per layer [max_lanes, nkv, extent, hd]
        self._values = [self._zeros(self._extent) for _ in range(cfg.n_layers)]
        self._scratch: list[np.ndarray] | None = None  # flat buffers a shorter run's caches are copied into
        self.cache_resizes = 0
        """Times the host arrays were reallocated to another extent."""
        self._binding = self._session.io_binding()
        self._ort = ort
        self._views: dict[tuple[int, int, int], list] = {}  # (first row, rows, extent) -> OrtValues of that range
        self._bound: tuple[int, int, int] | None = None
        self._row_of = np.arange(caps.max_lanes)  # lane slot -> the arrays' row holding its cache
        self._slot_at = np.arange(caps.max_lanes)  # row -> the lane slot whose cache it holds
        self._written = np.zeros(caps.max_lanes, np.int64)  # per slot: past the furthest position ever written
        self.cache_moves = 0
        """Lanes whose cache was swapped into another row so a run's lanes sit side by side."""
        if self.cache_inputs == "slots":  # the whole cache, bound once; the graph gathers the lanes
            self._bind_range(0, caps.max_lanes, self._extent)

    def _zeros(self, extent: int) -> np.ndarray:
        """One layer's K or V ``[max_lanes, n_kv_heads, extent, head_dim]``, zeroed lazily."""
        cfg = self.config
        return lazy_zeros((self.capabilities.max_lanes, cfg.n_kv_heads, extent, cfg.head_dim), self._dtype)

    def _hold(self, need: int) -> None:
        """Make the host arrays hold ``need`` positions per lane (a multiple of :data:`KEY_BLOCK`,
        or the whole window): grown to it when they hold fewer, shrunk to it when they hold two
        blocks more (a rollback and the next pass do not resize back and forth). The written
        positions move, one layer at a time (growing, the arrays are resized at most once per
        KEY_BLOCK positions the longest lane writes, and hold at most one layer twice); the views
        made of the old arrays are dropped first."""
        if self.cache_inputs == "slots" or self._extent - 2 * KEY_BLOCK < need <= self._extent:
            return
        keep = np.minimum(self._written[self._slot_at], need)  # per row: its written positions that stay
        # nothing may hold the old arrays while the new ones are made: each is freed once copied
        self._binding.clear_binding_inputs()
        self._views, self._bound, self._scratch = {}, None, None
        for arrays in (self._keys, self._values):
            for i, old in enumerate(arrays):
                new = self._zeros(need)
                for row in np.flatnonzero(keep):
                    new[row, :, :keep[row]] = old[row, :, :keep[row]]
                arrays[i] = new
        np.minimum(self._written, need, out=self._written)
        self._extent = need
        self.cache_resizes += 1

    def _run_extent(self, last: int) -> int:
        """The key extent a run whose last position is ``last`` binds: the arrays' whole (views, no
        copy) unless its own is at most half of it (then a copy of its own is cheaper than
        attending over the rest; :meth:`_bind_range`). Either gives the same bits."""
        own = self._extent_for(last)
        return own if 2 * own <= self._extent else self._extent

    def _extent_for(self, last: int) -> int:
        """The key extent of positions up to ``last``: ``last + 1`` rounded up to KEY_BLOCK, at most the window."""
        return min(self.capabilities.max_context + 1, -(-(int(last) + 1) // KEY_BLOCK) * KEY_BLOCK)

    # -- the protocol ------------------------------------------------------------

    def _forward_impl(self, rows: Rows) -> np.ndarray:
        self._check_open()
        vocab = self.capabilities.vocab
        # each wanted row once (logit_rows may name a row twice)
        unique_rows, inverse = np.unique(rows.logit_rows, return_inverse=True)
        logits = PassLogits.empty(unique_rows.shape[0], vocab, with_greedy=self._pass_outputs)
        if rows.num_rows == 0:
            return logits.rows(inverse)
        # group rows by lane, lanes in order of first appearance
        lane_order, first = np.unique(rows.slots, return_index=True)
        lane_order = lane_order[np.argsort(first, kind="stable")]
        lane_rows = [np.flatnonzero(rows.slots == lane) for lane in lane_order]
        wanted = np.full(rows.num_rows, -1, np.int64)  # row -> its place in logit_rows
        wanted[unique_rows] = np.arange(unique_rows.shape[0])
        groups = self._plan_runs([r.shape[0] for r in lane_rows])
        # each run's last position, its padding included (at most the trash slot)
        lasts = [max(int(rows.positions[lane_rows[j][0]]) for j in group) + max(lane_rows[j].shape[0] for j in group) - 1 for group in groups]
        live = max(int(self._state_len.max()), 1) - 1  # every lane's held positions stay
        self._hold(self._extent_for(max(lasts + [live])))
        for group, last in zip(groups, lasts):
            self._run(rows, [lane_order[j] for j in group], [lane_rows[j] for j in group], wanted, logits, self._run_extent(last))
        return logits if unique_rows.shape[0] == inverse.shape[0] and np.all(inverse == np.arange(inverse.shape[0])) else logits.rows(inverse)

    def _verify_sample_impl(self, logits: np.ndarray, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        self._check_open()
        greedy = getattr(logits, "greedy", None)
        if greedy is not None and not np.any(np.asarray(sample.mode) != _GREEDY):
            # every row greedy: the decoder graph's ArgMax is the greedy graph's, on these very logits
            return greedy, greedy == np.asarray(sample.draft)
        return self._sampler.run(logits, sample)

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # the length is the state: entries past it are masked, then overwritten

    def _release_impl(self, lane: int) -> None:
        self._written[lane] = 0  # nothing of it to keep when the arrays are resized or rows swapped

    def _block_parts(self, block_tokens: int) -> list:
        cfg = self.config
        return [((cfg.n_layers, cfg.n_kv_heads, block_tokens, cfg.head_dim), self._dtype)] * 2  # K, V

    def _save_block_impl(self, lane: int, start: int, index: int) -> None:
        self._check_open()
        keys, values = self.block_pool.arrays  # [blocks, n_layers, n_kv_heads, block_tokens, head_dim] each
        row, end = int(self._row_of[lane]), start + keys.shape[3]
        for i, (layer_keys, layer_values) in enumerate(zip(self._keys, self._values)):
            keys[index, i] = layer_keys[row, :, start:end]
            values[index, i] = layer_values[row, :, start:end]

    def _load_prefix_impl(self, lane: int, indices: list) -> None:
        self._check_open()
        keys, values = self.block_pool.arrays
        n = keys.shape[3]
        self._hold(max(self._extent, self._extent_for(len(indices) * n - 1)))
        row = int(self._row_of[lane])
        for j, index in enumerate(indices):
            for i, (layer_keys, layer_values) in enumerate(zip(self._keys, self._values)):
                layer_keys[row, :, j * n:(j + 1) * n] = keys[index, i]
                layer_values[row, :, j * n:(j + 1) * n] = values[index, i]
        self._written[lane] = max(int(self._written[lane]), len(indices) * n)

    def _lane_cache(self, lane: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of lane ``lane``'s K and V at positions ``start .. stop - 1``,
        ``[n_layers, n_kv_heads, stop - start, head_dim]`` each."""
        row = int(self._row_of[lane])
        return tuple(np.stack([layer[row, :, start:stop] for layer in arrays]) for arrays in (self._keys, self._values))

    def close(self) -> None:
        self._binding = None
        self._views = {}
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

    def _bind_range(self, first: int, n: int, extent: int) -> None:
        """Bind the cache rows ``first .. first + n - 1`` at key extent ``extent``: views of the
        host arrays when they hold that extent, else copies into the scratch buffers (a run
        whose positions need fewer keys than the arrays hold: a copy as long as its own extent
        costs less than attending over the arrays' and scattering into a copy of it)."""
        key = (first, n, extent)
        values = self._views.get(key)
        if values is None:
            values = self._views[key] = [
                self._ort.OrtValue.ortvalue_from_numpy(self._run_cache(i, arr, first, n, extent))
                for i, pair in enumerate(zip(self._keys, self._values))
                for arr in pair
            ]
        elif extent < self._extent:
            for i, pair in enumerate(zip(self._keys, self._values)):
                for arr in pair:
                    self._run_cache(i, arr, first, n, extent)
        if self._bound != key:
            self._bind_values(values)
            self._bound = key

    def _run_cache(self, layer: int, arr: np.ndarray, first: int, n: int, extent: int) -> np.ndarray:
        """Rows ``first .. first + n - 1`` of one layer's ``arr`` up to ``extent``: a view when the
        array holds that extent, else copied into that layer's scratch buffer."""
        rows = arr[first:first + n]
        if extent == arr.shape[2]:
            return rows
        if self._scratch is None:
            size = self.capabilities.max_lanes * self.config.n_kv_heads * self._extent * self.config.head_dim
            self._scratch = [lazy_zeros((size,), self._dtype) for _ in range(2 * self.config.n_layers)]
        which = 2 * layer + (arr is self._values[layer])
        out = self._scratch[which][: rows[:, :, :extent].size].reshape(rows.shape[:2] + (extent,) + rows.shape[3:])
        np.copyto(out, rows[:, :, :extent])
        return out

    def _bind_values(self, values: list) -> None:
        """Bind layer i's cache inputs to ``values[2 i]`` (keys) and ``values[2 i + 1]`` (values)."""
        for i in range(self.config.n_layers):
            key_name, value_name = cache_names(i)
            self._binding.bind_ortvalue_input(key_name, values[2 * i])
            self._binding.bind_ortvalue_input(value_name, values[2 * i + 1])

    def _bind_caches(self, rows: np.ndarray, extent: int) -> None:
        """Bind past_key_i / past_value_i to the cache rows ``rows`` (ascending, side by side) at
        key extent ``extent``."""
        if self.cache_inputs == "slots":
            self._binding.bind_cpu_input("lane_ids", rows)
            return
        self._bind_range(int(rows[0]), int(rows.shape[0]), extent)

    def _side_by_side(self, lanes: np.ndarray) -> np.ndarray:
        """The cache rows of ``lanes``, made contiguous: lanes outside the window of
        ``len(lanes)`` rows that already holds most of them swap rows with what is in it."""
        rows, n = self._row_of[lanes], lanes.shape[0]
        if int(rows.max()) - int(rows.min()) + 1 == n:
            return rows
        held = np.zeros(self.capabilities.max_lanes + 1, np.int64)
        held[rows + 1] = 1
        held = np.cumsum(held)  # held[r] = how many of the rows lie below r
        start = int(np.argmax(held[n:] - held[:-n]))  # the window [start, start + n) holding the most
        free = [r for r in range(start, start + n) if not np.any(rows == r)]
        for lane, row in zip(lanes, rows):
            if not start <= row < start + n:
                self._swap_rows(int(row), free.pop())
        return self._row_of[lanes]

    def _swap_rows(self, a: int, b: int) -> None:
        """Swap the caches in rows ``a`` and ``b`` (as far as either was written) and their owners."""
        sa, sb = int(self._slot_at[a]), int(self._slot_at[b])
        # not the lanes' state_len: an earlier run of the same forward call may have written further
        n = int(max(self._written[sa], self._written[sb]))
        for arr in self._keys + self._values:
            kept = arr[a, :, :n].copy()
            arr[a, :, :n] = arr[b, :, :n]
            arr[b, :, :n] = kept
        self._slot_at[a], self._slot_at[b] = sb, sa
        self._row_of[sa], self._row_of[sb] = b, a
        self.cache_moves += 1

    def _run(self, rows: Rows, lanes: list[int], lane_rows: list[np.ndarray], wanted: np.ndarray, logits: np.ndarray, extent: int) -> None:
        cfg, trash = self.config, self.capabilities.max_context
        cache_rows = self._side_by_side(np.asarray(lanes, np.int64))
        order = np.argsort(cache_rows, kind="stable")  # lanes by cache row: side by side, a view
        slots = cache_rows[order]
        lane_rows = [lane_rows[j] for j in order]
        b, t = len(lanes), max(r.shape[0] for r in lane_rows)
        input_ids = np.zeros((b, t), np.int64)
        # each lane's rows, then its padding at the positions after them (never visible to its real
        # rows, and no further than the trash slot): the pass form's key extent stays the pass's own
        firsts = rows.positions[[r[0] for r in lane_rows]]
        positions = np.minimum(firsts[:, None] + np.arange(t), trash)
        flat = np.concatenate([j * t + np.arange(r.shape[0]) for j, r in enumerate(lane_rows)])  # [n] run row of each
        src = np.concatenate(lane_rows)  # [n] the pass's row index of each
        input_ids.reshape(-1)[flat] = rows.tokens[src]
        keep = wanted[src] >= 0
        logit_index = np.ascontiguousarray(flat[keep])
        out_rows = wanted[src][keep]

        self._bind_caches(slots, extent)
        bind = self._binding
        bind.bind_cpu_input("input_ids", input_ids)
        bind.bind_cpu_input("positions", positions)
        bind.bind_cpu_input("logit_index", logit_index)
        for name in self._output_names:
            bind.bind_output(name)
        self._session.run_with_iobinding(bind)
        self.runs += 1
        run_logits, new_kv, *extra = (v.numpy() for v in bind.get_outputs())
        logits[out_rows] = run_logits
        if extra:
            logits.greedy[out_rows] = extra[0]
        # new_kv [n_layers, 2, B, T, nkv, hd] -> the cache at (slot, :, position, :)
        kv = new_kv.reshape(cfg.n_layers, 2, b * t, cfg.n_kv_heads, cfg.head_dim)[:, :, flat]
        row_slots = slots[flat // t]
        pos = rows.positions[src]
        np.maximum.at(self._written, self._slot_at[row_slots], pos + 1)
        for layer_kv, layer_keys, layer_values in zip(kv, self._keys, self._values):
            layer_keys[row_slots, :, pos] = layer_kv[0]
            layer_values[row_slots, :, pos] = layer_kv[1]

    def _check_open(self) -> None:
        if self._session is None:
            raise StatusError(Status.UNSUPPORTED, "OrtDecoderPrimitives: used after close()")

    # -- for tests and tools ---------------------------------------------------------

    def cache_rows(self, lane: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of lane ``lane``'s K and V for its ``state_len`` positions,
        ``[n_layers, n_kv_heads, state_len, head_dim]`` each."""
        return self._lane_cache(lane, 0, self.state_len(lane))


def open_model(
    model_dir: str | os.PathLike,
    *,
    max_lanes: int,
    max_context: int,
    threads: int | None = None,
    engines: str | os.PathLike | None = None,
    spinning: bool = False,
    providers: Sequence = ("CPUExecutionProvider",),
) -> OrtDecoderPrimitives:
    """The decoder of ``model_dir`` on onnxruntime with ``providers`` (the first
    one must exist here); the opener the backend registry names."""
    providers = list(providers)
    if providers and not isinstance(providers[0], str) and engines is not None:  # TensorRT EP: cache engines there
        name, options = providers[0]
        providers[0] = (name, {**options, "trt_engine_cache_path": os.fspath(Path(engines) / "ort_trt")})
    return OrtDecoderPrimitives(
        model_dir, max_lanes=max_lanes, max_context=max_context, threads=threads, providers=providers_for(providers),
        spinning=spinning,
    )


def loaded_graph(graph: Path, providers: Sequence, config: dict[str, str]):
    """What onnxruntime loads for the decoder ``graph`` (either form) on ``providers``: on the CPU
    alone, the graph in onnxruntime's fused ops (:mod:`sf_trt.graphs.ort_fusions`; fewer kernels a
    layer, rows as exact) with its attention summed in the same chunks at any thread count
    (:mod:`sf_trt.graphs.ort_attention`), its weights read from the model directory's file
    (``config`` gains where); on any other provider the graph as written, standard ONNX."""
    first = providers[0] if isinstance(providers[0], str) else providers[0][0]
    if first != "CPUExecutionProvider":
        return graph
    import onnx

    from ..graphs.ort_attention import exact_attention
    from ..graphs.ort_fusions import onnxruntime_fused

    config["session.model_external_initializers_file_folder_path"] = os.fspath(graph.parent)
    return exact_attention(onnxruntime_fused(onnx.load(os.fspath(graph), load_external_data=False)))
