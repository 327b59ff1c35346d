"""TensorRT primitives: the engines ``sf-trt build`` writes, behind the Primitives protocol.

:meth:`TensorRTPrimitives.open` reads ``engines/manifest.json``, refuses an
engine built by another TensorRT version or for another GPU (or whose bytes
changed), deserializes it, and keeps every buffer on the device: the model's
state (the fake's token history; a decoder's KV cache), the rows of a pass, the
logits, the drawn tokens. Each pass is ``set_input_shape`` / ``set_tensor_address``
/ ``execute_async_v3`` on one CUDA stream, every boolean result checked; decode
steps can be captured into CUDA graphs and replayed.

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

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...formats.manifest import ManifestError, check_manifest, read_manifest
from ...graphs.verify import LOGITS as VERIFY_LOGITS
from ...graphs.verify import MATCH as VERIFY_MATCH
from ...graphs.verify import TOKENS as VERIFY_TOKENS
from ...primitives import Capabilities, PrimitivesBase, Rows, SampleRows
from .adapters import COPY_STATE, DECODER_INPUTS, CopyModel, Decoder
from .buffers import BufferPlan, numpy_dtype
from .device import Device, NumpyDevice, TorchDevice
from .errors import TensorRTUnavailable, refuse
from .probes import device_info, import_tensorrt
from .runners import EngineRunner, OrtRunner, TrtRunner

__all__ = ["TensorRTPrimitives"]


class TensorRTPrimitives(PrimitivesBase):
    """The copy model (the TensorRT fake) or a decoder, and the verify-and-sample
    graph, as engines behind the Primitives protocol.

    Construct with :meth:`open` (TensorRT engines from a manifest directory),
    :meth:`fake` (the copy model for a :class:`~sf_trt.fake.FakeConfig`) or
    :meth:`stand_in` (the same graphs on onnxruntime, CPU; for tests). The
    model engine is told apart by its inputs: ``history`` (the copy model's
    token state) or ``past_key_0`` ... (a decoder's KV cache).

    Capabilities come from the engines: ``vocab`` from the logits, ``max_lanes``
    and ``max_context`` from the state buffers, ``max_rows_per_pass`` from the
    profile; ``eos`` and ``top_k_limit`` from the caller or the manifest's meta.
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
        if max_rows_per_pass is not None and max_rows_per_pass > m.max_rows:
            raise refuse(f"max_rows_per_pass {max_rows_per_pass} exceeds the engine's profile ({m.max_rows} rows)")
        verify_max = verify.plan[VERIFY_LOGITS].shape[0]
        super().__init__(
            Capabilities(
                vocab=int(m.vocab), eos=int(eos), max_lanes=int(m.max_lanes), max_context=int(m.max_context),
                max_rows_per_pass=int(min(max_rows_per_pass or m.max_rows, verify_max)), verify_rows=verify_rows,
                truncate_partial=truncate_partial, kernel_capabilities=kernel_capabilities, top_k_limit=int(top_k_limit),
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
        cuda_graph_limit: int = 8,
        **caps: Any,
    ) -> "TensorRTPrimitives":
        """Load engines ``model`` and ``verify`` from ``engine_dir`` after
        checking their manifest entries against this TensorRT and GPU.

        ``eos`` defaults to the manifest's ``meta["eos"]``; ``caps`` go to the
        constructor (``verify_rows``, ``truncate_partial``, ``top_k_limit``, ...).
        """
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
        try:
            entries = read_manifest(engine_dir)
            cc, _ = device_info(device)
        except (ManifestError, TensorRTUnavailable) as exc:
            raise refuse(str(exc)) from None
        for name in (model, verify):
            if name not in entries:
                raise refuse(f"no engine {name!r} in {os.fspath(engine_dir)}/manifest.json (has: {sorted(entries)})")
            try:
                check_manifest(entries[name], trt.__version__, cc, engine_path=Path(engine_dir) / entries[name].engine_file)
            except ManifestError as exc:
                raise refuse(str(exc)) from None
        if eos is None:
            if "eos" not in entries[model].meta:
                raise refuse(f"eos not given and not in the manifest's meta for {model!r}")
            eos = int(entries[model].meta["eos"])
        if "top_k_limit" in entries[verify].meta:
            caps.setdefault("top_k_limit", int(entries[verify].meta["top_k_limit"]))
        dev = TorchDevice(torch, device)
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        runners = [
            TrtRunner(
                trt, runtime, name, (Path(engine_dir) / entries[name].engine_file).read_bytes(),
                BufferPlan.from_manifest(entries[name]), dev, cuda_graphs=cuda_graphs, graph_limit=cuda_graph_limit,
            )
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
        cls, model_graph: Any, verify_graph: Any, *, max_rows_per_pass: int, eos: int, top_k_limit: int,
        max_lanes: int | None = None, max_context: int | None = None, **caps: Any,
    ) -> "TensorRTPrimitives":
        """The same pass logic with onnxruntime on the CPU in place of the
        engines (``model_graph`` / ``verify_graph``: ONNX models or paths).

        Not a production path: it exists so that everything but libnvinfer
        and the device copies is tested where there is no GPU. ``max_lanes``
        / ``max_context`` size a decoder's symbolic caches and bound its lanes
        per pass (as ``sf-trt build --max-lanes/--max-context`` would).
        """
        dims = {"rows": max_rows_per_pass, "logit_rows": max_rows_per_pass, "batch": max_lanes or max_rows_per_pass}
        if max_lanes is not None:
            dims["max_lanes"] = max_lanes
        if max_context is not None:
            dims["cache_len"] = max_context + 1
        model_plan = BufferPlan.from_onnx(model_graph, name="model", dims=dims)
        verify_plan = BufferPlan.from_onnx(verify_graph, name="verify", dims=dims)
        return cls(
            OrtRunner("model", model_graph, model_plan),
            OrtRunner("verify", verify_graph, verify_plan),
            NumpyDevice(),
            eos=eos, top_k_limit=top_k_limit, max_rows_per_pass=max_rows_per_pass, **caps,
        )

    # -- the protocol's backend half --------------------------------------------------------

    def _forward_impl(self, rows: Rows) -> Any:
        return self._model.forward(rows, self.capabilities.vocab)

    def _verify_sample_impl(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        dev = self._dev
        if sample.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        feeds = {VERIFY_LOGITS: logits}
        for b in self._verify.plan.inputs():
            if b.name != VERIFY_LOGITS:
                feeds[b.name] = dev.to_device(np.asarray(getattr(sample, b.name)).astype(numpy_dtype(b.dtype)))
        out = self._verify.run(feeds)
        tokens = dev.to_host(out[VERIFY_TOKENS]).astype(np.int64)
        match = dev.to_host(out[VERIFY_MATCH]).astype(bool)
        return tokens, match

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # rollback is the length PrimitivesBase keeps: nothing past it is read

    def logits_host(self, logits: Any) -> np.ndarray:
        return self._dev.to_host(logits).astype(np.float32, copy=False)

    def close(self) -> None:
        if self._model is not None:
            self._model.runner.close()
            self._model.close()
        if self._verify is not None:
            self._verify.close()
        self._model = self._verify = None


def _check_verify_plan(plan: BufferPlan, vocab: int) -> None:
    names = {b.name for b in plan.inputs()}
    wanted = {VERIFY_LOGITS} | {f.name for f in dataclasses.fields(SampleRows)}
    if names != wanted:
        raise refuse(
            f"verify engine {plan.engine!r} inputs {sorted(names)}; expected {sorted(wanted)} (logits and the SampleRows fields)"
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
) -> TensorRTPrimitives:
    """The decoder and verify engines under ``engines`` (default ``engines/``), built
    by ``sf-trt build`` from ``model_dir``; the opener the backend registry names.
    The engines' profiles fix the lanes and context (``max_lanes`` and
    ``max_context`` must fit them); ``threads`` does not apply."""
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
