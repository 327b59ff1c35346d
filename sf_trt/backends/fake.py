"""The fake backend: the copy model and the verify-and-sample graph, on onnxruntime.

Everything that decides a token runs as an ONNX graph in onnxruntime (SPEC
behaviour 9): the copy model's logits (:mod:`sf_trt.graphs.copy_model`) and the
draw (:mod:`sf_trt.graphs.verify`, the graph TensorRT engines are built from). numpy only
keeps the books: the per-lane token history, which is the fake's state, is a
``[max_lanes, max_context]`` tensor whose length per lane the executor truncates
on rollback.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Optional

import numpy as np

from ..abi import Status, StatusError
from ..graphs.copy_model import build_copy_graph
from ..primitives import Capabilities, PrimitivesBase, Rows, SampleRows
from .ort_adjust import HostLogitAdjust
from .ort_logprobs import HostLogprobs
from .ort_sampler import OrtVerifySampler
from .ort_session import open_session

__all__ = ["FakeConfig", "FakePrimitives"]


@dataclasses.dataclass
class FakeConfig:
    """The fake's model and capabilities (``dataclasses.replace`` makes variants).

    ``copy_model``: rows favour what followed the latest earlier occurrence of
    their token (else a deterministic function of token and position).
    ``copy_miss_every``: every m-th position favours another token.
    ``verify_rows`` / ``truncate_partial`` / ``kernel_capabilities``: what the
    backend claims, which strategy registration reads.
    ``pass_delay_s``: every forward pass also sleeps this long (a model's pace, for
    scaling tests and demos; the tokens are the same).
    """

    vocab: int = 256
    eos: int = 255
    copy_model: bool = False
    copy_miss_every: int = 0
    verify_rows: bool = False
    truncate_partial: bool = True
    kernel_capabilities: int = 0
    max_lanes: int = 64
    max_context: int = 1024
    max_rows_per_pass: int = 1024
    top_k_limit: int = 64
    favour_logit: Optional[float] = None
    threads: int = 1
    pass_delay_s: float = 0.0


class FakePrimitives(HostLogitAdjust, HostLogprobs, PrimitivesBase):
    """The fake model behind the Primitives protocol."""

    def __init__(self, cfg: FakeConfig = FakeConfig()) -> None:
        if cfg.vocab < 3 or not 0 <= cfg.eos < cfg.vocab:
            raise StatusError(Status.BAD_ARGUMENT, f"FakeConfig: need vocab >= 3 and 0 <= eos < vocab (got {cfg.vocab}, {cfg.eos})")
        if cfg.max_lanes < 1 or cfg.max_context < 2 or cfg.max_rows_per_pass < cfg.max_lanes:
            raise StatusError(
                Status.BAD_ARGUMENT,
                f"FakeConfig: need max_lanes >= 1, max_context >= 2, max_rows_per_pass >= max_lanes "
                f"(got {cfg.max_lanes}, {cfg.max_context}, {cfg.max_rows_per_pass})",
            )
        if cfg.favour_logit is not None and not math.isfinite(cfg.favour_logit):
            raise StatusError(Status.BAD_ARGUMENT, f"FakeConfig: favour_logit must be finite (got {cfg.favour_logit!r})")
        if not (math.isfinite(cfg.pass_delay_s) and cfg.pass_delay_s >= 0):
            raise StatusError(Status.BAD_ARGUMENT, f"FakeConfig: pass_delay_s must be a finite number of seconds >= 0 (got {cfg.pass_delay_s!r})")
        top_k_limit = min(cfg.top_k_limit, cfg.vocab)
        super().__init__(
            Capabilities(
                vocab=cfg.vocab, eos=cfg.eos, max_lanes=cfg.max_lanes, max_context=cfg.max_context,
                max_rows_per_pass=cfg.max_rows_per_pass, verify_rows=cfg.verify_rows,
                truncate_partial=cfg.truncate_partial, kernel_capabilities=cfg.kernel_capabilities, logprobs=True,
                top_k_limit=top_k_limit, state_bytes_per_token=8,
            )
        )
        self.config = cfg
        graph = build_copy_graph(
            cfg.vocab, cfg.eos, cfg.max_lanes, cfg.max_context, cfg.copy_miss_every, cfg.copy_model, cfg.favour_logit
        )
        self._model = open_session(graph, threads=cfg.threads)
        self._sampler = OrtVerifySampler(cfg.vocab, top_k_limit=top_k_limit, threads=cfg.threads)
        # The state: each lane's tokens by position (valid below state_len).
        self._history = np.zeros((cfg.max_lanes, cfg.max_context), np.int64)

    def _forward_impl(self, rows: Rows) -> np.ndarray:
        if self.config.pass_delay_s > 0:
            time.sleep(self.config.pass_delay_s)
        self._history[rows.slots, rows.positions] = rows.tokens
        if rows.logit_rows.size == 0:
            return np.zeros((0, self.capabilities.vocab), np.float32)
        (logits,) = self._model.run(
            None,
            {"history": self._history, "lanes": rows.slots[rows.logit_rows], "positions": rows.positions[rows.logit_rows]},
        )
        return logits

    def _verify_sample_impl(self, logits: np.ndarray, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        return self._sampler.run(logits, sample)

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # the length is the state: positions past it are dead and get overwritten

    def _block_parts(self, block_tokens: int) -> list:
        return [((block_tokens,), np.int64)]  # the tokens: 8 bytes a position

    def _save_block_impl(self, lane: int, start: int, index: int) -> None:
        (tokens,) = self.block_pool.arrays
        tokens[index] = self._history[lane, start:start + tokens.shape[1]]

    def _load_prefix_impl(self, lane: int, indices: list) -> None:
        (tokens,) = self.block_pool.arrays
        self._history[lane, : len(indices) * tokens.shape[1]] = tokens[indices].reshape(-1)

    def close(self) -> None:
        self._model = None
        self._sampler = None
