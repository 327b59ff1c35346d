#!/usr/bin/env python3
"""Greedy tokens of a reduced-precision or quantized decoder against fp32's, on the bench prompts.

    python tools/precision_agreement.py [--precision fp16] [--weights int8|q4|int4|gguf] [--max-tokens 64] [--prompts FILE] [--json OUT]
    SF_TRT_GGUF=gemma-3-270m-q4_k_m.gguf python tools/precision_agreement.py --weights int4   # another GGUF
    python tools/precision_agreement.py --candidate DIR     # any model directory of the same model

Exports the default model (SmolLM2-135M-Instruct, or the GGUF ``$SF_TRT_GGUF`` names; float32
weights) at fp32 and, as the candidate, at ``--precision`` (default fp16) or with ``--weights``
(int8, q4, int4 or gguf, at fp32) into the cache (once), or opens ``--candidate``, runs both on
onnxruntime's CPU kernels, and for every prompt of ``tools/prompts/bench.jsonl`` reports:

* **free-running**: each model decodes greedily on its own; how many leading tokens
  are identical (a single flipped near-tie changes everything after it);
* **teacher-forced**: the candidate reads fp32's continuation, and at each position
  its argmax is compared with fp32's token: per-token agreement that does not cascade;
  and the mean KL divergence of its next-token distribution from fp32's over those
  positions (nats; softmax of the logits at temperature 1).

:func:`agreement` takes any two backends (``tools/trt_device_check.py`` runs it
with TensorRT fp16 as the candidate). Exit status 0; the numbers are the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

BENCH_PROMPTS = ROOT / "tools" / "prompts" / "bench.jsonl"


@dataclasses.dataclass(frozen=True)
class PromptAgreement:
    id: str
    prompt_tokens: int
    tokens: int
    """Tokens the reference decoded greedily (at most max_tokens; fewer at EOS)."""
    identical_prefix: int
    """Leading tokens the candidate's own greedy decode shares with the reference's."""
    forced_matches: int
    """Positions of the reference's continuation where the candidate's argmax is the reference's token."""
    mean_kl: float = 0.0
    """Mean over those positions of KL(reference || candidate) of the next-token distributions, nats."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def bench_prompt_ids(tokenizer, path: Path = BENCH_PROMPTS) -> list[tuple[str, list[int]]]:
    """``(id, prompt ids)`` of every line of a bench prompts file (``sf-trt bench``'s format)."""
    from sf_trt.cli.bench import read_prompts
    from sf_trt.cli.generate import prompt_ids

    return [(row.id, prompt_ids(tokenizer, prompt=row.prompt, messages=row.messages, ids=row.prompt_ids)) for row in read_prompts(path)]


def greedy(prims, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's plain greedy continuation on ``prims`` (no speculation)."""
    from sf_trt.abi import SamplingParams
    from sf_trt.generate import Generator, Request

    gen = Generator(prims)
    return [r.tokens for r in gen.run([Request(p, params=SamplingParams(max_tokens=max_tokens), speculate=False) for p in prompts])]


def forced_logits(prims, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """``prims``' logits (float32 ``[len(continuation), vocab]``) at each token of ``continuation``,
    reading ``prompt + continuation``."""
    from sf_trt.primitives import Rows

    seq = np.asarray(prompt + continuation[:-1], np.int64)
    n, first, chunk = len(seq), len(prompt) - 1, prims.capabilities.max_rows_per_pass
    lane = 0
    prims.release(lane)
    out = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        wanted = np.arange(max(start, first), stop, dtype=np.int64) - start
        rows = Rows(np.zeros(stop - start, np.int64), np.arange(start, stop, dtype=np.int64), seq[start:stop], wanted)
        logits = prims.logits_host(prims.forward(rows)) if hasattr(prims, "logits_host") else np.asarray(prims.forward(rows))
        out.append(np.asarray(logits, np.float32))
    prims.release(lane)
    return np.concatenate(out)


def forced_argmax(prims, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """The argmax of ``prims``' logits at each token of ``continuation``, reading ``prompt + continuation``."""
    return forced_logits(prims, prompt, continuation).argmax(axis=1)


def mean_kl(reference: np.ndarray, candidate: np.ndarray) -> float:
    """Mean over rows of KL(softmax(reference) || softmax(candidate)), nats (float64)."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        x = x - x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(reference), log_softmax(candidate)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1))) if len(lp) else 0.0


def agreement(reference, candidate, prompts: list[tuple[str, list[int]]], max_tokens: int) -> list[PromptAgreement]:
    """Greedy agreement of backend ``candidate`` with backend ``reference`` on ``prompts``."""
    ids = [p for _, p in prompts]
    want = greedy(reference, ids, max_tokens)
    got = greedy(candidate, ids, max_tokens)
    out = []
    for (pid, prompt), w, g in zip(prompts, want, got):
        prefix = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), min(len(w), len(g)))
        forced, kl = 0, 0.0
        if w:
            cand = forced_logits(candidate, prompt, w)
            forced = int(np.sum(cand.argmax(axis=1) == np.asarray(w)))
            kl = mean_kl(forced_logits(reference, prompt, w), cand)
        out.append(PromptAgreement(pid, len(prompt), len(w), int(prefix), forced, round(kl, 6)))
    return out


def summary(rows: list[PromptAgreement]) -> dict:
    tokens = sum(r.tokens for r in rows)
    return {
        "prompts": len(rows),
        "identical_outputs": sum(r.identical_prefix == r.tokens for r in rows),
        "identical_prefix_tokens": sum(r.identical_prefix for r in rows),
        "forced_matches": sum(r.forced_matches for r in rows),
        "tokens": tokens,
        "forced_agreement": round(sum(r.forced_matches for r in rows) / tokens, 4) if tokens else 1.0,
        "mean_kl": round(sum(r.mean_kl * r.tokens for r in rows) / tokens, 6) if tokens else 0.0,
    }


def print_table(rows: list[PromptAgreement], label: str) -> None:
    print(f"{'prompt':<22} {'prompt tok':>10} {'tokens':>6} {'identical prefix':>16} {'teacher-forced top-1':>20} {'mean KL':>9}")
    for r in rows:
        print(f"{r.id:<22} {r.prompt_tokens:>10} {r.tokens:>6} {r.identical_prefix:>16} {r.forced_matches:>13}/{r.tokens:<6} {r.mean_kl:>9.5f}")
    s = summary(rows)
    print(f"{label}: {s['identical_outputs']} of {s['prompts']} outputs identical; "
          f"{s['identical_prefix_tokens']} of {s['tokens']} tokens before the first difference; "
          f"teacher-forced agreement {s['forced_matches']}/{s['tokens']} = {100 * s['forced_agreement']:.2f}%; mean KL {s['mean_kl']:.5f} nats")


def main(argv=None) -> int:
    from sf_trt.formats.model_dir import PRECISIONS, WEIGHT_DTYPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=[p for p in PRECISIONS if p != "fp32"], default=None,
                    help="the candidate's compute precision, float32 weights (default fp16 unless --weights)")
    ap.add_argument("--weights", choices=[w for w in WEIGHT_DTYPES if w != "float32"], default=None,
                    help="the candidate's weights instead, at fp32 (int8, q4, int4, gguf)")
    ap.add_argument("--candidate", type=Path, default=None, metavar="DIR",
                    help="a model directory of the same model as the candidate instead (an export made another way)")
    ap.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    ap.add_argument("--prompts", type=Path, default=BENCH_PROMPTS)
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime threads (default: one per core)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and the summary here")
    args = ap.parse_args(argv)

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.tokenizer import Tokenizer

    if sum(x is not None for x in (args.weights, args.precision, args.candidate)) > 1:
        ap.error("--precision, --weights and --candidate: give one (a quantized candidate computes at fp32)")
    precision = "fp32" if args.weights else args.precision or "fp16"
    reference = default_model_dir(weight_dtype="float32", precision="fp32")
    if args.candidate is not None:
        candidate, label = args.candidate, str(args.candidate)
    else:
        candidate = default_model_dir(weight_dtype=args.weights or "float32", precision=precision)
        label = f"{args.weights} weights" if args.weights else precision
    prompts = bench_prompt_ids(Tokenizer.load(reference), args.prompts)
    context = max(len(p) for _, p in prompts) + args.max_tokens + 1
    open_ = lambda d: OrtDecoderPrimitives(d, max_lanes=1, max_context=context, threads=args.threads)  # noqa: E731
    with open_(reference) as ref, open_(candidate) as cand:
        rows = agreement(ref, cand, prompts, args.max_tokens)
    print_table(rows, f"onnxruntime CPU, {label} vs fp32 (float32 weights), {args.max_tokens} greedy tokens")
    if args.json:
        args.json.write_text(json.dumps({"rows": [r.to_json() for r in rows], "summary": summary(rows)}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
