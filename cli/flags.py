"""The flags commands share: the model, the backend, sampling; defaults taken from the library."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Optional

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
from sf_trt.backends import BACKENDS, names as backend_names
from sf_trt.drafting import PromptLookupConfig
from sf_trt.entrypoints.model import CONTEXT_STEP, DEFAULT_CONTEXT
from sf_trt.formats.model_dir import AUTO_WEIGHTS, WEIGHT_CHOICES
from sf_trt.scheduler import SchedulerConfig

__all__ = ["ranged", "add_model_flags", "add_sampling_flags", "sampling", "draft_policy", "scheduler_config", "CONTEXT_STEP", "DEFAULT_CONTEXT", "DRAFT_POLICIES"]

DRAFT_POLICIES = ("load-aware", "always")
"""--draft-policy's choices: sf_trt.scheduler.LoadAwareDrafting, and DraftPolicy (drafts whenever the drafter finds one)."""


def ranged(kind, lo=None, hi=None, lo_open=False, what=""):
    """An argparse type: ``kind`` in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what or kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and math.isnan(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got NaN")
        if lo is not None and (value < lo or (lo_open and value == lo)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    return parse


def add_model_flags(p: argparse.ArgumentParser, extra_backends: Optional[dict[str, str]] = None) -> None:
    """The model and backend flags; ``extra_backends``: more ``--backend`` choices, name -> help."""
    extra = extra_backends or {}
    g = p.add_argument_group("model")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--gguf", type=Path, help="a GGUF file of a supported family (llama, mistral, qwen2, qwen3, gemma3, phi3; "
                     "exported to ONNX on first use, then reused)")
    src.add_argument("--hf", type=Path, metavar="DIR",
                     help="a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json) of a supported family; "
                     "exported on first use, then reused")
    src.add_argument("--model", type=Path, help="a model directory written by `sf-trt export`")
    g.add_argument("--backend", choices=(*backend_names(), *extra), default="onnxruntime",
                   help="; ".join([*(f"{b.name}: {b.summary}" for b in BACKENDS.values()), *(f"{n}: {h}" for n, h in extra.items())]))
    g.add_argument("--engines", type=Path, default=Path("engines"),
                   help="with --backend tensorrt: the directory of engines and manifest.json (default engines/)")
    g.add_argument("--threads", type=ranged(int, 1, what="threads >= 1"), default=None,
                   help="onnxruntime intra-op threads (default: one per core; more than the cores is capped, with a note)")
    g.add_argument("--spin", action="store_true",
                   help="onnxruntime's intra-op threads spin between ops instead of sleeping: faster when nothing else "
                   "runs on the cores (a 1-row pass about 1.2-1.4x here), much slower when other jobs share them "
                   "(default: sleep); what llama.cpp's OpenMP threads do unless OMP_WAIT_POLICY=PASSIVE")
    g.add_argument("--weights", choices=WEIGHT_CHOICES, default=AUTO_WEIGHTS,
                   help=f"{AUTO_WEIGHTS} (default: gguf for a GGUF of 1B+ parameters in 4-bit blocks on onnxruntime's CPU "
                   "path, where a pass reads every weight; int8 otherwise, and for the default model), int8 (per-channel "
                   "int8 weights, onnxruntime's 8-bit kernels), float32 "
                   "(the GGUF dequantized as it is) or q4 (4 bits per block of 32 in onnxruntime's MatMulNBits: the GGUF's "
                   "own Q4_0, Q4_1 and Q4_K blocks as they are, other matrices requantized) or int4 (every matrix requantized "
                   "to 4 bits with a zero point per block of 32, 4-bit blocks and the lm_head included: onnxruntime-genai's "
                   "int4, the fewest bytes a token, values rounded a second time) or gguf (each matrix in its own "
                   "GGUF blocks, no value changed: 4 bits where they are Q4_*, else 8 bits; F16/F32 in Q8_0); q4, int4 and "
                   "gguf run on onnxruntime only; speculative == plain under each")
    g.add_argument("--max-context", type=ranged(int, 2, what="a context of >= 2 positions"), default=None,
                   help="positions per lane: prompt plus output, at most the model's context (default: the longest "
                   f"prompt plus its max tokens, rounded up to a multiple of {CONTEXT_STEP} and capped at the model's "
                   "context; output that would run past it stops there). On onnxruntime a pass reads keys only up to its "
                   "largest position (rounded up to 64), so the window costs memory, not time; TensorRT engines read it whole")


def add_sampling_flags(p: argparse.ArgumentParser, max_tokens_default: Optional[int]) -> None:
    draft_default = PromptLookupConfig.max_draft
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=ranged(int, 1, what="max tokens >= 1"), default=None,
                   help=f"most tokens to generate (default {max_tokens_default})" if max_tokens_default else "override every prompt's max_tokens")
    p.set_defaults(max_tokens_default=max_tokens_default)  # None: the flag was not given
    g.add_argument("--temperature", type=ranged(float, 0.0, what="a temperature >= 0"), default=0.0,
                   help="0 (default) is greedy; > 0 samples (Gumbel-max, keyed by --seed and position)")
    g.add_argument("--top-p", type=ranged(float, 0.0, 1.0, lo_open=True, what="top-p in (0, 1]"), default=SamplingParams.top_p)
    g.add_argument("--top-k", type=ranged(int, 0, what="top-k >= 0 (0: off)"), default=SamplingParams.top_k)
    g.add_argument("--seed", type=ranged(int, 0, 2**63 - 1, what="a seed in 0..2**63-1"), default=0,
                   help="the RNG counter base (the same seed draws the same tokens)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--presence-penalty", type=ranged(float, -2.0, 2.0, what="a penalty in [-2, 2]"), default=0.0,
                   help="subtracted once from the logit of every token the output holds (vLLM's; 0: off)")
    g.add_argument("--frequency-penalty", type=ranged(float, -2.0, 2.0, what="a penalty in [-2, 2]"), default=0.0,
                   help="times a token's count in the output, subtracted from its logit (vLLM's; 0: off)")
    g.add_argument("--repetition-penalty", type=ranged(float, 2.0**-16, 2.0**16, what="a penalty in [2**-16, 2**16]"), default=1.0,
                   help="divides the positive, multiplies the negative logits of prompt and output tokens (vLLM's; 1: off)")
    g.add_argument("--min-tokens", type=ranged(int, 0, what="min tokens >= 0"), default=0,
                   help="hold the end-of-sequence token back until this many tokens (vLLM's)")
    g.add_argument("--max-draft", type=ranged(int, 1, 256, what="a draft length in 1..256"), default=draft_default,
                   help=f"most draft tokens per verify pass (default {draft_default})")
    g.add_argument("--draft-policy", choices=DRAFT_POLICIES, default="load-aware",
                   help="load-aware (default): a lane drafts while its drafts are taken often enough to pay for their rows, "
                   "and no lane drafts in a batch of 5 or more; always: every pass carries whatever draft the drafter finds. "
                   "Neither changes a token")
    g.add_argument("--tick-tokens", type=ranged(int, 1, 4096, what="tokens per tick in 1..4096"), default=SchedulerConfig.tick_tokens,
                   help=f"tokens each lane is asked for per tick (default {SchedulerConfig.tick_tokens})")


def draft_policy(args: argparse.Namespace):
    """The drafting policy ``--draft-policy`` names."""
    from sf_trt.scheduler import DraftPolicy, LoadAwareDrafting

    return LoadAwareDrafting() if args.draft_policy == "load-aware" else DraftPolicy()


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    """The batch scheduler configuration the flags ask for (draft length, tokens per tick, policy)."""
    from sf_trt.drafting import PromptLookupConfig

    return SchedulerConfig(tick_tokens=args.tick_tokens, draft_config=PromptLookupConfig(max_draft=args.max_draft), policy=draft_policy(args))


def sampling(args: argparse.Namespace) -> tuple[Sampling, SamplingParams]:
    """The sampling mode and parameters the flags ask for (temperature 0: greedy)."""
    flags = SamplingFlag.IGNORE_EOS if args.ignore_eos else SamplingFlag(0)
    greedy = args.temperature == 0
    params = SamplingParams(
        temperature=1.0 if greedy else args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens or args.max_tokens_default or 0, flags=flags,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty, min_tokens=args.min_tokens,
    )
    return (Sampling.GPU_GREEDY if greedy else Sampling.GPU_GUMBEL), params
