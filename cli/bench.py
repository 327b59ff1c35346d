"""``sf-trt bench``: every prompt of a file plain and speculative, side by side."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from sf_trt.abi import SamplingParams

from .errors import CliError
from .flags import add_model_flags, add_sampling_flags, ranged, sampling
from .generate import generator, prompt_ids
from .launch import context_window, open_backend, resolve

__all__ = ["add_bench_parser", "bench", "read_prompts", "BENCH_KEYS", "BenchPrompt"]


BENCH_KEYS = ("id", "kind", "messages", "prompt", "prompt_ids", "max_tokens")
"""The keys a line of a prompts file may have."""
DEFAULT_MAX_TOKENS = 192
MAX_TOKENS_LIMIT = 1 << 20


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="plain vs speculative on a prompts file, side by side",
                       description="Run every prompt plain and speculative with the same parameters; print tokens/s, "
                       "speedup, acceptance and whether the outputs are identical (exit 1 if any differ). Tokens/s count from "
                       "admission (prefill included); the decode-only rates leave out the time the same groups of prompts "
                       "take to their first token (run once more with one token each), and --json has each request's time "
                       "to its first token.")
    b.add_argument("--prompts", type=Path, required=True,
                   help='JSONL: {"id", "kind", "messages": [{"role", "content"}, ...] | "prompt": str | "prompt_ids": [...], '
                   f'"max_tokens" (default {DEFAULT_MAX_TOKENS})}} per line; every line is checked before the first prompt runs')
    b.add_argument("--lanes", type=ranged(int, 1, 64, what="lanes in 1..64"), default=1, help="prompts run at once (default 1)")
    b.add_argument("--repeats", type=ranged(int, 1, 100, what="repeats in 1..100"), default=1,
                   help="run each group of prompts this many times, plain, speculative and its prefill alike, and count the "
                   "fastest of each (default 1); every repeat must give the same tokens (exit 1 if one does not)")
    b.add_argument("--json", action="store_true", help="print the results as one JSON object")
    add_sampling_flags(b, None)
    add_model_flags(b)
    b.set_defaults(func=cmd_bench)


@dataclasses.dataclass(frozen=True)
class BenchPrompt:
    """One line of a prompts file, checked."""

    where: str
    """``path:line (id X)``, for messages."""
    id: str
    kind: str | None
    max_tokens: int
    prompt: str | None = None
    messages: list | None = None
    prompt_ids: list | None = None


def read_prompts(path: Path) -> list[BenchPrompt]:
    """Every line of the prompts file, checked before anything runs: the first
    problem is a CliError naming the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"--prompts {path}: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CliError(f"{path}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x})") from None
    rows, seen = [], {}
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            row = _check_line(f"{path}:{n}", line, n)
            if row.id in seen:
                raise CliError(f"{path}:{n}: id {row.id!r} is already used on line {seen[row.id]}")
            seen[row.id] = n
            rows.append(row)
    if not rows:
        raise CliError(f"--prompts {path}: no prompts")
    return rows


def _check_line(where: str, line: str, n: int) -> BenchPrompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CliError(f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise CliError(f"{where}: not JSON (nested too deeply)") from None
    if not isinstance(row, dict):
        raise CliError(f"{where}: expected a JSON object, got {_json_type(row)}")
    unknown = sorted(set(row) - set(BENCH_KEYS))
    if unknown:
        raise CliError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(BENCH_KEYS)})")
    given = [k for k in ("messages", "prompt", "prompt_ids") if k in row]
    if len(given) != 1:
        raise CliError(f"{where}: expected an object with exactly one of messages, prompt, prompt_ids (got {sorted(row)})")
    rid = row.get("id", f"line{n}")
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise CliError(f"{where}: id must be a non-empty string or an int (got {_json_type(rid)})")
    rid = str(rid)
    kind = row.get("kind")
    if kind is not None and not isinstance(kind, str):
        raise CliError(f"{where}: kind must be a string (got {_json_type(kind)})")
    mt = row.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= MAX_TOKENS_LIMIT:
        raise CliError(f"{where}: max_tokens must be an int in 1..{MAX_TOKENS_LIMIT} (got {mt!r})")
    where = f"{where} (id {rid})"
    key, value = given[0], row[given[0]]
    if key == "prompt" and (not isinstance(value, str) or not value):
        raise CliError(f"{where}: prompt must be a non-empty string (got {_json_type(value)})")
    if key == "prompt_ids" and (not isinstance(value, list) or not value or not all(_is_id(t) for t in value)):
        raise CliError(f"{where}: prompt_ids must be a non-empty list of token ids >= 0 (got {_json_type(value)})")
    if key == "messages":
        ok = isinstance(value, list) and value and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values()) for m in value
        )
        if not ok:
            raise CliError(f'{where}: messages must be a non-empty list of {{"role": str, "content": str}} objects')
    return BenchPrompt(where, rid, kind, mt, **{key: value})


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def _json_type(value) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null", float: "a number", int: "an int"}
    return names.get(type(value), type(value).__name__)


def bench(args) -> dict:
    """Every prompt plain, then speculative, with the same parameters; the results."""
    from sf_trt.generate import Request
    from sf_trt.tokenizer import TokenizerError

    rows = read_prompts(args.prompts)
    model = resolve(args, progress=not args.json)
    tok, vocab = model.tokenizer, model.model_dir.config.vocab
    mode, params = sampling(args)
    requests = []
    for row in rows:
        if row.prompt_ids is not None and max(row.prompt_ids) >= vocab:
            raise CliError(f"{row.where}: token id {max(row.prompt_ids)} outside the vocabulary (0..{vocab - 1})")
        try:
            ids = prompt_ids(tok, prompt=row.prompt, messages=row.messages, ids=row.prompt_ids)
        except TokenizerError as exc:
            raise CliError(f"{row.where}: {exc}") from None
        p = dataclasses.replace(params, max_tokens=args.max_tokens or row.max_tokens)
        requests.append(Request(ids, mode, p, seed=args.seed))
    max_context = context_window(
        args.max_context, model.model_dir.max_positions,
        [(f"{row.where}: prompt", len(r.prompt_ids), r.params.max_tokens) for row, r in zip(rows, requests)],
    )
    prims = open_backend(args, model, max_lanes=args.lanes, max_context=max_context)
    gen = generator(prims, args)
    gen.run([Request(requests[0].prompt_ids[:8], mode, SamplingParams(max_tokens=4), speculate=False)])  # warm up
    # Plain and speculative side by side, group by group of `lanes` prompts, so a
    # change in the machine's load hits both alike.
    runs = {"plain": ([], 0.0), "spec": ([], 0.0)}
    prefill_s = 0.0  # the same groups with one token each: what the decode-only rates leave out
    repeat_differs: set[int] = set()  # requests a repeat gave other tokens
    for lo in range(0, len(requests), args.lanes):
        group = requests[lo : lo + args.lanes]
        fastest: dict[str, tuple[float, list]] = {}  # label -> (seconds, results) of its fastest repeat
        group_prefill_s = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            gen.run([dataclasses.replace(r, speculate=False, params=dataclasses.replace(r.params, max_tokens=1)) for r in group])
            group_prefill_s = min(group_prefill_s, time.perf_counter() - t0)
            for label, speculate in (("plain", False), ("spec", True)):
                t0 = time.perf_counter()
                results = gen.run([dataclasses.replace(r, speculate=speculate) for r in group])
                secs = time.perf_counter() - t0
                if label in fastest:
                    repeat_differs.update(lo + j for j, (a, b) in enumerate(zip(fastest[label][1], results))
                                          if (a.tokens, a.finish) != (b.tokens, b.finish))
                if secs < fastest.get(label, (float("inf"),))[0]:
                    fastest[label] = (secs, results)
        prefill_s += group_prefill_s
        for label in ("plain", "spec"):
            done, secs = runs[label]
            runs[label] = (done + fastest[label][1], secs + fastest[label][0])
    out = []
    for j, (row, req, plain, spec) in enumerate(zip(rows, requests, runs["plain"][0], runs["spec"][0])):
        out.append({
            "id": row.id, "kind": row.kind, "prompt_tokens": len(req.prompt_ids),
            "identical": plain.tokens == spec.tokens and plain.finish == spec.finish and j not in repeat_differs,
            "repeats_identical": j not in repeat_differs,
            "plain": _rates(plain),
            "spec": {**_rates(spec), "proposed": spec.proposed, "accepted": spec.accepted, "passes": spec.passes},
        })
    total = {label: sum(len(r.tokens) for r in results) / secs for label, (results, secs) in runs.items()}
    decode = {label: _decode_rate(sum(max(0, len(r.tokens) - 1) for r in results), secs, prefill_s) for label, (results, secs) in runs.items()}
    return {
        "results": out,
        "throughput_tokens_per_s": {k: round(v, 2) for k, v in total.items()},
        "decode_tokens_per_s": {k: None if v is None else round(v, 2) for k, v in decode.items()},
        "prefill_seconds": round(prefill_s, 3),
        "settings": {"lanes": args.lanes, "repeats": args.repeats, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                     "seed": args.seed, "threads": args.threads, "max_draft": args.max_draft, "draft_policy": args.draft_policy, "backend": args.backend,
                     "weights": model.model_dir.weights, "max_context": max_context},
    }


DECODE_SHARE_MIN = 0.1
"""The least share of a run's time that must be left once its prefill is taken out for the
decode-only rate to be given (the two are timed in separate runs: on a run that is nearly all
prefill their difference is noise, and its rate absurd)."""


def _decode_rate(tokens: int, run_s: float, prefill_s: float) -> float | None:
    """Tokens after each request's first over the run's time less its prefill's; None where that
    leaves under :data:`DECODE_SHARE_MIN` of the run."""
    decode_s = run_s - prefill_s
    return tokens / decode_s if decode_s > DECODE_SHARE_MIN * run_s else None


def _rates(res) -> dict:
    """One request's numbers: tokens/s from admission (prefill included), time to its first token."""
    return {"tokens": len(res.tokens), "tokens_per_s": round(res.tokens_per_s, 2), "finish": res.finish.name.lower(),
            "first_token_s": None if res.first_token_s is None else round(res.first_token_s, 4)}


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
        t, d = report["throughput_tokens_per_s"], report["decode_tokens_per_s"]
        rate = {k: "n/a (the run is nearly all prefill: raise --max-tokens)" if v is None else f"{v:.1f} tok/s" for k, v in d.items()}
        print(f"throughput over all prompts ({args.lanes} lane(s)): plain {t['plain']:.1f} tok/s, spec {t['spec']:.1f} tok/s; "
              f"decode only (less {report['prefill_seconds']:.2f} s of prefill): plain {rate['plain']}, spec {rate['spec']}")
    bad = [r["id"] for r in report["results"] if not r["identical"]]
    if bad:
        unrepeated = [r["id"] for r in report["results"] if not r["repeats_identical"]]
        if unrepeated:
            print(f"sf-trt: a repeat of the same request gave other tokens on {', '.join(unrepeated)}", file=sys.stderr)
        if len(unrepeated) < len(bad):
            print(f"sf-trt: speculative output differs from plain on {', '.join(r for r in bad if r not in unrepeated)}", file=sys.stderr)
        return 1
    return 0
