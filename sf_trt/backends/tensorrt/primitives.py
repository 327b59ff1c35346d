"""TensorRT primitives: the engines ``sf-trt build`` writes, behind the Primitives protocol.

:meth:`TensorRTPrimitives.open` reads ``engines/manifest.json``, refuses an
engine built by another TensorRT version or for another GPU (or whose bytes
changed, or whose profile is not fixed), deserializes it, and keeps every buffer on
the device: the model's state (the fake's token history; a decoder's KV cache), the
rows of a pass, the logits, the drawn tokens. Every engine takes one shape: each pass
is padded to it, and a pass that does not fit is split into several runs (the
adapters; the verify engine here), so a row is always computed on the same shapes
whatever shares its pass. Each run is ``set_input_shape`` / ``set_tensor_address`` /
``execute_async_v3`` on one CUDA stream, every boolean result checked; with
``cuda_graphs`` the one shape is captured into a CUDA graph and replayed.

Rollback is a length, as on every backend: ``truncate`` moves the lane's state
length back (``PrimitivesBase`` keeps it) and nothing is copied; positions past
it are never read by the graphs and are overwritten by the next pass::

    lane state  [0 .......... committed) [committed ... draft end)
                 kept, read by attention   rejected: dead, rewritten next pass

Only this module imports ``tensorrt`` and ``torch`` (for device buffers), and
only inside :meth:`TensorRTPrimitives.open`: importing it needs neither.
:class:`BufferPlan` (what to allocate, from a graph or a manifest) and the whole
pass logic run on the CPU too, with onnxruntime standing in for the engines
(:meth:`TensorRTPrimitives.stand_in`), which is how they are tested without a GPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.manifest import ManifestError, check_engine_file, check_manifest, read_manifest
from ...formats.shapes import ShapeLimits, derive_profiles
from ...graphs.noise import MUL_RANGE
from ...graphs.verify import GREEDY, NOISE_MUL, sample_feeds
from ...graphs.verify import LOGITS as VERIFY_LOGITS
from ...graphs.verify import MATCH as VERIFY_MATCH
from ...graphs.verify import SAMPLE_INPUTS as VERIFY_SAMPLE_INPUTS
from ...graphs.verify import TOKENS as VERIFY_TOKENS
from ...primitives import Capabilities, PrimitivesBase, Rows, SampleRows
from ..ort_adjust import HostLogitAdjust
from ..ort_logprobs import HostLogprobs
from .adapters import COPY_STATE, DECODER_INPUTS, CopyModel, Decoder
from .buffers import BufferPlan, numpy_dtype
from .device import Device, NumpyDevice, TorchDevice
from .errors import TensorRTUnavailable, refuse
from .probes import cuda_mismatch, device_info, import_tensorrt, stack_versions, start_tensorrt
from .runners import EngineRunner, OrtRunner, TrtRunner

__all__ = ["TensorRTPrimitives"]


class TensorRTPrimitives(HostLogitAdjust, HostLogprobs, PrimitivesBase):
    """The copy model (the TensorRT fake) or a decoder, and the verify-and-sample
    graph, as engines behind the Primitives protocol.

    Construct with :meth:`open` (TensorRT engines from a manifest directory),
    :meth:`fake` (the copy model for a :class:`~sf_trt.fake.FakeConfig`) or
    :meth:`stand_in` (the same graphs on onnxruntime, CPU; for tests). The
    model engine is told apart by its inputs: ``history`` (the copy model's
    token state) or ``past_key_0`` ... (a decoder's KV cache).

    Capabilities come from the engines: ``vocab`` from the logits, ``max_lanes``
    and ``max_context`` from the state buffers; ``eos`` and ``top_k_limit`` from the
    caller or the manifest's meta. ``max_rows_per_pass`` (the most rows a forward
    call takes) is the caller's, by default the model engine's rows per run: a pass
    with more rows, or a lane with more rows than a run holds, runs as several runs.

    No prefix cache yet, so no block pool (``state_bytes_per_token`` is 0, so
    ``open_block_pool``, ``save_block`` and ``load_prefix`` are refused with
    ``UNSUPPORTED`` and the executor keeps no cache):
    the state lives in device buffers, and whether copying blocks of it in and out
    pays against recomputing them on a GPU is not measured.
    """

    def __init__(
        self,
        model: EngineRunner,
        verify: EngineRunner,
        device: Device,
        *,
        eos: int,
        verify_rows: bool = True,
        truncate_partial: bool = True,
        kernel_capabilities: int = 0,
        top_k_limit: int | None = None,
        max_rows_per_pass: int | None = None,
    ) -> None:
        self._verify, self._dev = verify, device
        names = [b.name for b in model.plan.inputs()]
        if COPY_STATE in model.plan:
            self._model: CopyModel | Decoder | None = CopyModel(model, device)
        elif all(n in model.plan for n in DECODER_INPUTS):
            self._model = Decoder(model, device)
        else:
            raise refuse(
                f"model engine {model.name!r} is neither the copy model ({COPY_STATE!r} input) nor a decoder "
                f"({', '.join(DECODER_INPUTS)}); its inputs: {names}"
            )
        m = self._model
        _check_verify_plan(verify.plan, m.vocab)
        if top_k_limit is None:
            raise refuse(f"top_k_limit not given (the largest top_k verify engine {verify.name!r} was built for)")
        self._verify_rows = verify.plan[VERIFY_LOGITS].shape[0]
        self._staging = device.zeros((self._verify_rows, m.vocab), "float32")  # a verify run's padded logits
        super().__init__(
            Capabilities(
                vocab=int(m.vocab), eos=int(eos), max_lanes=int(m.max_lanes), max_context=int(m.max_context),
                max_rows_per_pass=int(max_rows_per_pass or m.max_rows), verify_rows=verify_rows,
                truncate_partial=truncate_partial, kernel_capabilities=kernel_capabilities, top_k_limit=int(top_k_limit), logprobs=True,
            )
        )

    # -- constructors ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        engine_dir: str | os.PathLike = "engines",
        *,
        model: str = "copy_model",
        verify: str = "verify",
        eos: int | None = None,
        device: int = 0,
        cuda_graphs: bool = False,
        **caps: Any,
    ) -> "TensorRTPrimitives":
        """Load engines ``model`` and ``verify`` from ``engine_dir`` after
        checking their manifest entries: the manifest, the engine files and the
        engines' one shape first (no TensorRT needed), then this TensorRT and GPU.
        The engines are deserialized with CUDA device ``device`` current (an engine
        belongs to the device it is deserialized on) and run there.

        ``eos`` defaults to the manifest's ``meta["eos"]``; ``caps`` go to the
        constructor (``verify_rows``, ``truncate_partial``, ``top_k_limit``, ...).
        """
        try:
            entries = read_manifest(engine_dir)
            plans = {}
            for name in (model, verify):
                if name not in entries:
                    raise refuse(f"no engine {name!r} in {os.fspath(engine_dir)}/manifest.json (has: {sorted(entries)})")
                check_engine_file(entries[name], engine_dir)
                plans[name] = BufferPlan.from_manifest(entries[name])  # refuses an engine of more than one shape
        except ManifestError as exc:
            raise refuse(str(exc)) from None
        try:
            trt = import_tensorrt()
        except TensorRTUnavailable as exc:
            raise refuse(str(exc)) from None
        try:
            import torch  # noqa: PLC0415
        except ImportError as exc:
            raise refuse(f"needs torch (with CUDA) for device buffers: {exc}") from None
        if not torch.cuda.is_available():
            raise refuse("torch sees no CUDA device")
        if not 0 <= device < torch.cuda.device_count():
            raise refuse(f"CUDA device {device} does not exist here (devices: 0..{torch.cuda.device_count() - 1})")
        try:
            cc, _ = device_info(device)
            for name in (model, verify):
                check_manifest(entries[name], trt.__version__, cc)
        except (ManifestError, TensorRTUnavailable) as exc:
            raise refuse(str(exc)) from None
        mismatch = cuda_mismatch(stack_versions(trt, device))
        if mismatch:
            raise refuse(mismatch)
        if eos is None:
            if "eos" not in entries[model].meta:
                raise refuse(f"eos not given and not in the manifest's meta for {model!r}")
            eos = int(entries[model].meta["eos"])
        if "top_k_limit" in entries[verify].meta:
            caps.setdefault("top_k_limit", int(entries[verify].meta["top_k_limit"]))
        dev = TorchDevice(torch, device)
        with dev.current():  # the runtime and the engines belong to this device
            try:
                runtime = start_tensorrt(trt, "Runtime", trt.Logger(trt.Logger.WARNING))
            except TensorRTUnavailable as exc:
                raise refuse(str(exc)) from None
            runners = [
                TrtRunner(trt, runtime, name, (Path(engine_dir) / entries[name].engine_file).read_bytes(), plans[name], dev, cuda_graphs=cuda_graphs)
                for name in (model, verify)
            ]
        return cls(runners[0], runners[1], dev, eos=eos, **caps)

    @classmethod
    def fake(cls, engine_dir: str | os.PathLike, cfg: Any, **kw: Any) -> "TensorRTPrimitives":
        """The TensorRT fake: the copy-model engine built from ``cfg`` (a
        :class:`~sf_trt.fake.FakeConfig`), with the capabilities ``cfg`` claims."""
        return cls.open(
            engine_dir, model=kw.pop("model", "copy_model"), eos=cfg.eos, verify_rows=cfg.verify_rows,
            truncate_partial=cfg.truncate_partial, kernel_capabilities=cfg.kernel_capabilities,
            top_k_limit=min(cfg.top_k_limit, cfg.vocab), max_rows_per_pass=cfg.max_rows_per_pass, **kw,
        )

    @classmethod
    def stand_in(
        cls, model_graph: Any, verify_graph: Any, shapes: ShapeLimits, *, eos: int, top_k_limit: int, **caps: Any,
    ) -> "TensorRTPrimitives":
        """The same pass logic with onnxruntime on the CPU in place of the
        engines (``model_graph`` / ``verify_graph``: ONNX models or paths), each
        run at the one shape ``shapes`` gives it, as ``sf-trt build`` with those
        shapes would build it (the same profile, :func:`~sf_trt.formats.shapes.derive_profiles`).

        Not a production path: it exists so that everything but libnvinfer
        and the device copies is tested where there is no GPU.
        """
        plans = [BufferPlan.from_onnx(g, name=name, dims=derive_profiles(g, shapes).max_dims()) for g, name in ((model_graph, "model"), (verify_graph, "verify"))]
        return cls(
            OrtRunner("model", model_graph, plans[0]), OrtRunner("verify", verify_graph, plans[1]), NumpyDevice(),
            eos=eos, top_k_limit=top_k_limit, **caps,
        )

    # -- the protocol's backend half --------------------------------------------------------

    def _forward_impl(self, rows: Rows) -> Any:
        return self._model.forward(rows, self.capabilities.vocab)

    def _verify_sample_impl(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        """Runs of the verify engine's one shape (``R`` rows): each run's rows are copied
        into a padded ``[R, vocab]`` buffer, the other rows fed as greedy rows (their
        tokens dropped); a pass of more than ``R`` rows is several runs."""
        dev, k, size = self._dev, sample.num_rows, self._verify_rows
        tokens, match = np.zeros(k, np.int64), np.zeros(k, bool)
        host = sample_feeds(sample) if k else {}  # the fields, and the noise keys made from rng_counter_base and position
        with dev.on_stream():
            for lo in range(0, k, size):
                self._verify_run(logits, host, lo, min(size, k - lo), tokens, match)
        return tokens, match

    def _verify_run(self, logits: Any, host: dict, lo: int, m: int, tokens: np.ndarray, match: np.ndarray) -> None:
        """One verify run of rows ``lo .. lo + m`` (padded to the engine's rows), their draws into ``tokens`` / ``match``."""
        dev = self._dev
        dev.put(self._staging, (slice(0, m),), logits[lo : lo + m])
        feeds = {VERIFY_LOGITS: self._staging}
        for b in self._verify.plan.inputs():
            if b.name != VERIFY_LOGITS:
                padded = np.full(b.shape, _VERIFY_PADDING.get(b.name, 0), numpy_dtype(b.dtype))
                padded[:m] = host[b.name][lo : lo + m]
                feeds[b.name] = dev.to_device(padded)
        out = self._verify.run(feeds)
        tokens[lo : lo + m] = dev.to_host(out[VERIFY_TOKENS])[:m]
        match[lo : lo + m] = dev.to_host(out[VERIFY_MATCH])[:m]

    def _adjust_impl(self, logits: Any, adjust) -> Any:
        """The adjust graph on onnxruntime over the host's copy of the rows (penalties, bias,
        min_tokens: only lanes that ask pay), back on the device for the verify engine.
        An adjust engine (the graph passes ``sf-trt build --check``) would keep them there."""
        return self._dev.to_device(super()._adjust_impl(logits, adjust))  # to_device runs on the runtime's stream

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # rollback is the length PrimitivesBase keeps: nothing past it is read

    def graphs_captured(self) -> dict[str, bool]:
        """Per engine, whether its runs replay a captured CUDA graph (``open(cuda_graphs=True)``
        captures at each engine's first run; a refused capture leaves ``False``)."""
        return {r.name: bool(r.graph_captured) for r in (self._model.runner, self._verify)}

    def logits_host(self, logits: Any) -> np.ndarray:
        return self._dev.to_host(logits).astype(np.float32, copy=False)

    def close(self) -> None:
        if self._model is not None:
            self._model.runner.close()
            self._model.close()
        if self._verify is not None:
            self._verify.close()
        self._model = self._verify = None


_VERIFY_PADDING = {"mode": GREEDY, "temperature": 1.0, "top_p": 1.0, "top_k": 0, NOISE_MUL: MUL_RANGE[0], "draft": -1}
"""What a verify run's padding rows are fed: greedy rows, their keys inside the declared ranges (0 elsewhere)."""


def _check_verify_plan(plan: BufferPlan, vocab: int) -> None:
    names = {b.name for b in plan.inputs()}
    wanted = {VERIFY_LOGITS} | set(VERIFY_SAMPLE_INPUTS)
    if names != wanted:
        raise refuse(
            f"verify engine {plan.engine!r} inputs {sorted(names)}; expected {sorted(wanted)} (logits and sample_feeds' inputs)"
        )
    outs = {b.name for b in plan.outputs()}
    if not {VERIFY_TOKENS, VERIFY_MATCH} <= outs:
        raise refuse(f"verify engine {plan.engine!r} outputs {sorted(outs)}; expected {VERIFY_TOKENS!r} and {VERIFY_MATCH!r}")
    if plan[VERIFY_LOGITS].shape[1] != vocab:
        raise refuse(f"verify engine {plan.engine!r} takes vocab {plan[VERIFY_LOGITS].shape[1]}, the model returns {vocab}")


def open_model(
    model_dir: str | os.PathLike,
    *,
    max_lanes: int,
    max_context: int,
    threads: int | None = None,
    engines: str | os.PathLike | None = None,
    spinning: bool = False,
) -> TensorRTPrimitives:
    """The decoder and verify engines under ``engines`` (default ``engines/``), built
    by ``sf-trt build`` from ``model_dir``; the opener the backend registry names.
    The engines' profiles fix the lanes and context (``max_lanes`` and
    ``max_context`` must fit them); ``threads`` and ``spinning`` (onnxruntime's) do not apply."""
    from ...formats.model_dir import ModelDir, ModelDirError

    try:
        eos = ModelDir.open(model_dir).config.eos
    except ModelDirError as exc:
        raise refuse(str(exc)) from None
    prims = TensorRTPrimitives.open(engines or "engines", model="decoder", verify="verify", eos=eos)
    caps = prims.capabilities
    if max_lanes > caps.max_lanes or max_context > caps.max_context:
        prims.close()
        raise refuse(
            f"the engines take {caps.max_lanes} lanes of {caps.max_context} positions; asked for {max_lanes} of "
            f"{max_context} (rebuild with `sf-trt build --max-lanes/--max-context`)"
        )
    return prims
