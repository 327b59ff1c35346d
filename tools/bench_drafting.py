"""Drafters on repeated work: plain, prompt lookup and suffix drafting, side by side.

    python tools/bench_drafting.py [--lanes 1 8] [--workloads repeated agent single] [--json bench_drafting.json]
    python tools/bench_drafting.py --replay bench_drafting.json [--suffix max_draft=24 ...]
    PYTHONPATH=.:ARCTIC python tools/bench_drafting.py --arctic bench_drafting.json   (dev only, see below)

The workloads are built from text that ships with Python: the standard
library's sources, found through ``sysconfig`` (frozen modules have no
``inspect`` source, the files do):

- ``repeated``: 40 requests, two tasks (add type hints; summarize in two
  sentences) over 20 related functions (the same names in ``posixpath.py`` and
  ``ntpath.py``), one function after another.
- ``agent``: 8 episodes of 5 turns. Each turn gives the task, the agent's
  previous reply and a new observation (the next lines of the function), and
  asks it to restate its plan and give its next action.
- ``single``: ``tools/prompts/bench.jsonl``, one request at a time, the suffix
  drafter private (``draft_scope=None``: its own text only, no corpus).

Each group of requests (one per lane) runs plain, then with prompt lookup,
then with suffix drafting, on one model and one executor, so the machine's load
hits all three alike; every output is checked token for token against plain
(exit 1 otherwise). The suffix corpus starts empty for each workload and lane
count (a scope of its own) and grows as its requests finish. The model is
SmolLM2-135M-Instruct on onnxruntime (int8 weights, ``--threads``), greedy.

``--replay``: the recorded token streams (prompt and plain output of every
request) rerun through the real Generator and Executor on a backend that draws
the recorded tokens: drafting statistics exactly as with the model, in seconds,
for tuning drafter settings (``--suffix`` / ``--prompt-lookup`` key=value).

``--cost``: drafting's own cost, no model: microseconds per token to extend
and propose at a 1k history over a 1k-token corpus and at a 32k history over a
1M-token corpus (real tokens: the standard library's sources through the
model's tokenizer), interleaved in rounds so load hits both alike; also the
corpus's build cost and memory per token.

``--arctic``: the same streams, one request after another, drafted by our
drafters and by ArcticInference's ``SuffixDecodingCache``, for acceptance
lengths (dev-time only: build its ``_C`` extension into a throwaway venv and run
this file with that venv's python, ``PYTHONPATH=.:<dir holding arctic_inference>``).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
from sf_trt.drafting import PromptLookupConfig, PromptLookupDrafter, SuffixConfig, SuffixCorpus, SuffixDrafter
from sf_trt.scheduler import SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plain", "prompt_lookup", "suffix")
TICK_TOKENS = SchedulerConfig.tick_tokens
"""What the Generator asks each lane for per tick (the batch profile)."""


# -- workloads ---------------------------------------------------------------------------


def stdlib_functions(filename: str) -> dict[str, str]:
    """Top-level functions of a standard-library module, by name, as source text."""
    path = Path(sysconfig.get_paths()["stdlib"]) / filename
    text = path.read_text(encoding="utf-8")
    return {n.name: ast.get_source_segment(text, n) for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


REPEATED_TASKS = (
    "Add type hints to this function. Keep the body exactly the same and return the whole function.",
    "Summarize what this function does in two sentences.",
)


def repeated_workload(n_functions: int = 20) -> list[dict]:
    """40 requests: the same two tasks over related path functions, function by function."""
    posix, nt = stdlib_functions("posixpath.py"), stdlib_functions("ntpath.py")
    names = [n for n in sorted(posix) if n in nt and not n.startswith("_")]
    sources = [(f"{m}.{n}", src[n]) for n in names for m, src in (("posixpath", posix), ("ntpath", nt))][:n_functions]
    return [
        {"id": f"{name}:{'hints' if t == 0 else 'summary'}", "messages": user(f"{task}\n\n```python\n{code}\n```"), "max_tokens": 128}
        for name, code in sources for t, task in enumerate(REPEATED_TASKS)
    ]


AGENT_SYSTEM = (
    "You are a coding agent that documents Python functions. Every reply has two parts: "
    "'Plan:' with the numbered steps of your plan, then 'Action:' with one JSON object "
    '{"tool": "read" | "write_docstring" | "finish", "target": "<function name>"}.'
)


def agent_turn(episode: int, turn: int, name: str, code: str, previous: Optional[str]) -> dict:
    lines = code.splitlines()
    chunk = "\n".join(lines[turn * 4 : turn * 4 + 4]) or "(end of function)"
    text = f"Task: write a docstring for `{name}`.\nStep {turn + 1} of 5.\n"
    if previous is not None:  # the last 800 characters: prompts stay well inside the context
        text += f"Your previous reply:\n{previous[-800:]}\n"
    text += f"Observation (the next lines of the function):\n```python\n{chunk}\n```\nRestate your plan, then give your next action."
    messages = [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": text}]
    return {"id": f"agent{episode}:turn{turn}", "messages": messages, "max_tokens": 96}


def agent_sources(episodes: int = 8) -> list[tuple[str, str]]:
    funcs = stdlib_functions("textwrap.py") | stdlib_functions("shlex.py")
    return [(n, funcs[n]) for n in sorted(funcs) if not n.startswith("_")][:episodes]


def single_workload() -> list[dict]:
    rows = [json.loads(line) for line in (ROOT / "tools/prompts/bench.jsonl").read_text().splitlines() if line.strip()]
    return [{"id": r["id"], "messages": r["messages"], "max_tokens": r.get("max_tokens", 192)} for r in rows]


# -- running --------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    passes: int = 0
    proposed: int = 0
    accepted: int = 0

    def add(self, results, seconds: float) -> None:
        self.requests += len(results)
        self.tokens += sum(len(r.tokens) for r in results)
        self.seconds += seconds
        self.passes += sum(r.passes for r in results)
        self.proposed += sum(r.proposed for r in results)
        self.accepted += sum(r.accepted for r in results)

    def row(self) -> dict:
        return {
            **dataclasses.asdict(self), "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
            "accepted_per_pass": self.accepted / self.passes if self.passes else 0.0,
            "tokens_per_pass": self.tokens / self.passes if self.passes else 0.0,
        }


class Bench:
    """One Generator over one backend; workloads run group by group, every kind side by side."""

    def __init__(self, gen, encode: Callable[[list[dict]], list[int]], ignore_eos: bool) -> None:
        self.gen = gen
        self.encode = encode
        self.flags = SamplingFlag.IGNORE_EOS if ignore_eos else SamplingFlag(0)
        self.streams: dict[str, list[dict]] = {}
        self.mismatches: list[str] = []

    def _requests(self, items: list[dict], kind: str, scope: Optional[str]) -> list:
        from sf_trt.generate import Request

        drafter = {"speculate": False} if kind == "plain" else {"drafter": kind}
        return [Request(self.encode(it["messages"]) if "prompt_ids" not in it else it["prompt_ids"], Sampling.GPU_GREEDY,
                        SamplingParams(max_tokens=it["max_tokens"], flags=self.flags), draft_scope=scope, **drafter)
                for it in items]

    def run_group(self, name: str, items: list[dict], tallies: dict[str, Tally], scope: Optional[str]) -> list[list[int]]:
        """Run one group plain, then each drafter; the plain outputs."""
        plain = None
        for kind in KINDS:
            reqs = self._requests(items, kind, scope)
            t0 = time.perf_counter()
            results = self.gen.run(reqs)
            tallies[kind].add(results, time.perf_counter() - t0)
            if plain is None:
                plain = results
                for it, req, res in zip(items, reqs, results):
                    self.streams.setdefault(name, []).append({"id": it["id"], "prompt_ids": list(req.prompt_ids), "output_ids": res.tokens,
                                                              "finish": res.finish.name.lower()})
            for it, p, r in zip(items, plain, results):
                if (r.tokens, r.finish) != (p.tokens, p.finish):
                    self.mismatches.append(f"{name}/{it['id']}/{kind}")
        return [r.tokens for r in plain]

    def workload(self, name: str, lanes: int, tokenizer, limit: int) -> dict:
        tallies = {k: Tally() for k in KINDS}
        scope = None if name == "single" else f"{name}/{lanes}"
        if name == "agent":
            sources = agent_sources(min(8, limit))
            previous: list[Optional[str]] = [None] * len(sources)
            for turn in range(5):
                items = [agent_turn(e, turn, n, code, previous[e]) for e, (n, code) in enumerate(sources)]
                for lo in range(0, len(items), lanes):
                    outs = self.run_group(name, items[lo : lo + lanes], tallies, scope)
                    for e, out in enumerate(outs, lo):
                        previous[e] = tokenizer.decode(out, skip_special=True)
        else:
            items = (repeated_workload() if name == "repeated" else single_workload())[:limit]
            group = 1 if name == "single" else lanes
            for lo in range(0, len(items), group):
                self.run_group(name, items[lo : lo + group], tallies, scope)
        return {k: t.row() for k, t in tallies.items()}


# -- replay: the recorded streams, drafted through the real executor --------------------------------


def replay_primitives(streams: list[dict], vocab: int, eos: int, max_lanes: int, max_context: int):
    """A backend that draws, at every position, the token the recorded plain run drew there."""
    from sf_trt.primitives import Capabilities, PrimitivesBase, Rows

    mod = (1 << 61) - 1
    table: dict[int, int] = {}
    for s in streams:
        full = s["prompt_ids"] + s["output_ids"]
        h = 0
        for p, tok in enumerate(full[:-1]):
            h = (h * 1_000_003 + tok + 1) % mod
            if p >= len(s["prompt_ids"]) - 1:
                table[h] = full[p + 1]

    class Replay(PrimitivesBase):
        def __init__(self) -> None:
            super().__init__(Capabilities(vocab=vocab, eos=eos, max_lanes=max_lanes, max_context=max_context,
                                          max_rows_per_pass=4096, verify_rows=True, truncate_partial=True))
            self._hash = np.zeros((max_lanes, max_context), np.int64)  # hash of tokens[0..p]
            self._next: list[int] = []

        def _forward_impl(self, rows: Rows):
            hashes = self._hash
            for lane, pos, tok in zip(rows.slots.tolist(), rows.positions.tolist(), rows.tokens.tolist()):
                prev = int(hashes[lane, pos - 1]) if pos else 0
                hashes[lane, pos] = (prev * 1_000_003 + tok + 1) % mod
            self._next = [table.get(int(hashes[lane, pos]), 0) for lane, pos in
                          zip(rows.slots[rows.logit_rows].tolist(), rows.positions[rows.logit_rows].tolist())]
            return np.broadcast_to(np.zeros(1, np.float32), (len(self._next), vocab))

        def _verify_sample_impl(self, logits, sample):
            drawn = np.asarray(self._next, np.int64)
            return drawn, drawn == sample.draft

        def _truncate_impl(self, lane: int, length: int) -> None:
            pass

    return Replay()


def replay(path: Path, lanes_list: list[int], configs: dict[str, Any]) -> dict:
    from sf_trt.generate import Generator, Request
    from sf_trt.scheduler import DraftPolicy

    data = json.loads(path.read_text())
    out = {}
    for name, streams in data["streams"].items():
        max_context = max(len(s["prompt_ids"]) + len(s["output_ids"]) for s in streams) + 64
        for lanes in lanes_list:
            prims = replay_primitives(streams, data["vocab"], data["eos"], max(lanes, 1), max_context)
            gen = Generator(prims, draft_config=[configs["prompt_lookup"], configs["suffix"]], tick_tokens=TICK_TOKENS,
                            policy=DraftPolicy())  # the drafters compared, not the policy: every lane drafts
            tallies = {k: Tally() for k in KINDS if k != "plain"}
            group = 1 if name == "single" else lanes
            for lo in range(0, len(streams), group):
                chunk = streams[lo : lo + group]
                for kind in tallies:
                    reqs = [Request(s["prompt_ids"], params=SamplingParams(max_tokens=len(s["output_ids"]), flags=(
                        SamplingFlag(0) if s["finish"] == "eos" else SamplingFlag.IGNORE_EOS)), drafter=kind,
                        draft_scope=None if name == "single" else "replay") for s in chunk]
                    t0 = time.perf_counter()
                    results = gen.run(reqs)
                    tallies[kind].add(results, time.perf_counter() - t0)
                    for s, r in zip(chunk, results):
                        if r.tokens != s["output_ids"]:
                            raise SystemExit(f"replay: {name}/{s['id']}/{kind} drew other tokens than recorded")
            out[f"{name}/{lanes}"] = {k: t.row() for k, t in tallies.items()}
    return out


# -- cost: drafting per token at 1k and at 32k history / 1M corpus -----------------------------------


def stdlib_tokens(n: int) -> list[int]:
    """At least ``n`` tokens of standard-library source, through the model's tokenizer."""
    from sf_trt.entrypoints.model import ModelSpec, resolve

    tok = resolve(ModelSpec(weights="int8")).tokenizer
    ids: list[int] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        ids.extend(tok.encode(path.read_text(encoding="utf-8", errors="replace")))
        if len(ids) >= n:
            break
    return ids


def cost(cfg: SuffixConfig, rounds: int = 5, steps: int = 1000) -> dict:
    import resource
    import tracemalloc

    corpus_big, history_big = 1 << 20, 32 << 10
    text = stdlib_tokens(corpus_big + history_big + 2 * (1024 + 1024) + 2 * rounds * steps)
    cfg = dataclasses.replace(cfg, corpus_tokens=corpus_big)
    setups = {}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    at = 0
    for label, corpus_len, history_len in (("1k / 1k", 1024, 1024), ("32k / 1M", corpus_big, history_big)):
        corpus = SuffixCorpus(cfg)
        t0 = time.perf_counter()
        for lo in range(at, at + corpus_len, 1000):  # requests of 1000 tokens
            corpus.add("", text[lo : min(lo + 1000, at + corpus_len)])
        build = time.perf_counter() - t0
        at += corpus_len
        history = text[at : at + history_len]
        at += history_len
        t0 = time.perf_counter()
        setups[label] = {
            "suffix": SuffixDrafter(cfg, history, corpus), "prompt_lookup": PromptLookupDrafter(PromptLookupConfig(), history),
            "corpus_tokens": corpus_len, "history": history_len, "build_us_per_token": 1e6 * build / corpus_len,
            "generations": len(corpus.generations("")), "corpus": corpus,
        }
        setups[label]["own_build_us_per_token"] = 1e6 * (time.perf_counter() - t0) / history_len
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    tracemalloc.start()
    sample = SuffixCorpus(cfg)
    for lo in range(0, 100_000, 1000):
        sample.add("", text[lo : lo + 1000])
    corpus_bytes = tracemalloc.get_traced_memory()[0] / 100_000
    tracemalloc.stop()
    stream = text[at:]
    spent = {(label, kind): [0.0, 0, 0] for label in setups for kind in ("suffix", "prompt_lookup")}
    work = {label: [0, 0] for label in setups}  # automaton states visited, tokens
    for r in range(rounds):  # interleaved: every setup and kind in every round
        for label, setup in setups.items():
            for kind in ("suffix", "prompt_lookup"):
                d = setup[kind]
                chunk = stream[(2 * r) * steps : (2 * r + 1) * steps] if kind == "suffix" else stream[(2 * r + 1) * steps : (2 * r + 2) * steps]
                drafted = 0
                automata = [d.own] + [g.automaton for g in setup["corpus"].generations("")] if kind == "suffix" else []
                work_before = sum(a.work for a in automata)
                t0 = time.perf_counter()
                for tok in chunk:
                    d.extend((tok,))
                    drafted += len(d.propose(16))
                if kind == "suffix":
                    work[label][0] += sum(a.work for a in automata) - work_before
                    work[label][1] += len(chunk)
                acc = spent[(label, kind)]
                acc[0] += time.perf_counter() - t0
                acc[1] += len(chunk)
                acc[2] += drafted
    rows = []
    for (label, kind), (secs, n, drafted) in spent.items():
        setup = setups[label]
        rows.append({"setup": label, "kind": kind, "us_per_token": 1e6 * secs / n, "mean_draft": drafted / n,
                     "us_per_token_and_draft_token": 1e6 * secs / (n + drafted), "generations": setup["generations"],
                     "states_per_token": work[label][0] / work[label][1] if kind == "suffix" else None,
                     "corpus_build_us_per_token": setup["build_us_per_token"] if kind == "suffix" else None,
                     "history_build_us_per_token": setup["own_build_us_per_token"] if kind == "suffix" else None})
    return {"rows": rows, "corpus_bytes_per_token": corpus_bytes, "max_rss_growth_kib": rss, "config": dataclasses.asdict(cfg)}


def print_cost(report: dict) -> None:
    print(f"{'history / corpus':<17} {'drafter':<14} {'us/token':>9} {'mean draft':>10} {'us/(token+draft)':>17} {'states/token':>12} "
          f"{'generations':>11} {'corpus build us/token':>21}")
    for r in report["rows"]:
        build = f"{r['corpus_build_us_per_token']:.1f}" if r["corpus_build_us_per_token"] is not None else "-"
        states = f"{r['states_per_token']:.1f}" if r["states_per_token"] is not None else "-"
        print(f"{r['setup']:<17} {r['kind']:<14} {r['us_per_token']:>9.1f} {r['mean_draft']:>10.2f} "
              f"{r['us_per_token_and_draft_token']:>17.2f} {states:>12} {r['generations']:>11} {build:>21}")
    by = {(r["setup"], r["kind"]): r for r in report["rows"]}
    for kind in ("suffix", "prompt_lookup"):
        big, small = by[("32k / 1M", kind)], by[("1k / 1k", kind)]
        states = (f", {big['states_per_token'] / small['states_per_token']:.2f}x automaton states per token"
                  if big["states_per_token"] else "")
        print(f"{kind}: 32k / 1M over 1k / 1k: {big['us_per_token'] / small['us_per_token']:.2f}x per token, "
              f"{big['us_per_token_and_draft_token'] / small['us_per_token_and_draft_token']:.2f}x per token and draft token{states}")
    print(f"corpus memory: {report['corpus_bytes_per_token']:.0f} bytes per token (tracemalloc, 100k tokens); "
          f"max RSS grew {report['max_rss_growth_kib'] / 1024:.0f} MiB building both setups")


# -- arctic: the same streams through ArcticInference's suffix cache (dev only) ----------------------


def simulate(streams: list[dict], start: Callable, propose: Callable, accept: Callable, stop: Callable, k: int) -> dict:
    """One request after another, a decode loop that takes the matching prefix of each
    draft plus one drawn token, ``TICK_TOKENS`` a tick as the Generator asks."""
    passes = proposed = accepted = tokens = 0
    for i, s in enumerate(streams):
        truth = s["output_ids"]
        start(i, s["prompt_ids"])
        pos = 0
        while pos < len(truth):
            tick_left = TICK_TOKENS - pos % TICK_TOKENS
            draft = propose(i, s["prompt_ids"] + truth[:pos], min(k, tick_left - 1, len(truth) - pos - 1))
            a = 0
            while a < len(draft) and draft[a] == truth[pos + a]:
                a += 1
            new = truth[pos : pos + a + 1]
            accept(i, new, len(draft), a)
            pos += len(new)
            passes += 1
            proposed += len(draft)
            accepted += a
        stop(i, s["prompt_ids"] + truth)
        tokens += len(truth)
    return {"passes": passes, "proposed": proposed, "accepted": accepted, "tokens": tokens,
            "accepted_per_pass": accepted / passes, "tokens_per_pass": tokens / passes}


def compare_arctic(path: Path, k: int) -> dict:
    from arctic_inference.suffix_decoding import SuffixDecodingCache  # the throwaway venv's, never a dependency

    data = json.loads(path.read_text())
    out = {}
    for name, streams in data["streams"].items():
        row = {}
        drafters: dict[int, Any] = {}
        corpus = SuffixCorpus(SuffixConfig(max_draft=k))
        ours = {
            "prompt_lookup": lambda i, p: PromptLookupDrafter(PromptLookupConfig(max_draft=k), p),
            "suffix": lambda i, p: SuffixDrafter(SuffixConfig(max_draft=k), p, corpus, None if name == "single" else ""),
        }
        for label, make in ours.items():
            drafters.clear()

            def start(i, prompt, make=make):
                drafters[i] = make(i, prompt)

            def propose(i, context, n):
                d = drafters[i]
                return d.propose(min(n, d.draft_cap))

            def accept(i, new, proposed, a):
                drafters[i].extend(new)
                drafters[i].observe(proposed, a)

            row[label] = simulate(streams, start, propose, accept, lambda i, full: drafters.pop(i).retire(), k)
        for depth in (24, 64):
            cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=-1 if name != "single" else 0)

            def a_propose(i, context, n, cache=cache):
                if n <= 0:
                    return []
                d = cache.speculate(i, np.asarray(context, np.int32), max_spec_tokens=n, max_spec_factor=1.0, min_token_prob=0.1)
                return list(d.token_ids)

            row[f"arctic_depth{depth}"] = simulate(
                streams, lambda i, p, cache=cache: cache.start_request(i, np.asarray(p, np.int32)), a_propose,
                lambda i, new, proposed, a, cache=cache: cache.add_active_response(i, np.asarray(new, np.int32)),
                lambda i, full, cache=cache: cache.stop_request(i), k)
        out[name] = row
    return out


# -- reporting ----------------------------------------------------------------------------------------


def estimated_speedup(r: dict, row_cost: float) -> float:
    """Plain passes / drafted passes, a verify row costing ``row_cost`` of a pass:
    tokens / (passes + row_cost x proposed). One lane on this CPU: about 0.15."""
    return r["tokens"] / (r["passes"] + row_cost * r["proposed"]) if r["passes"] else 0.0


def print_table(results: dict, row_cost: Optional[float] = None) -> None:
    """tok/s for measured runs; for replays (no model) the estimated speedup instead."""
    speed = "tok/s" if row_cost is None else "est.x"
    print(f"{'workload':<10} {'lanes':>5} {'kind':<14} {speed:>7} {'vs plain':>8} {'tokens':>7} {'passes':>6} {'proposed':>8} "
          f"{'acc/pass':>8} {'tok/pass':>8}")
    for key, rows in results.items():
        name, lanes = key.split("/")
        plain = rows.get("plain", {}).get("tokens_per_s")
        for kind, r in rows.items():
            value = r["tokens_per_s"] if row_cost is None else estimated_speedup(r, row_cost)
            vs = f"{r['tokens_per_s'] / plain:7.2f}x" if plain else "       -"
            print(f"{name:<10} {lanes:>5} {kind:<14} {value:>7.2f} {vs} {r['tokens']:>7} {r['passes']:>6} {r['proposed']:>8} "
                  f"{r['accepted_per_pass']:>8.2f} {r['tokens_per_pass']:>8.2f}")
        pl, sx = rows.get("prompt_lookup"), rows.get("suffix")
        if pl and sx and pl["passes"]:
            measured = f"{sx['tokens_per_s'] / pl['tokens_per_s']:.2f}x tok/s, " if row_cost is None else (
                f"{estimated_speedup(sx, row_cost) / estimated_speedup(pl, row_cost):.2f}x estimated, ")
            print(f"{'':<10} {'':>5} suffix / prompt lookup: {measured}{sx['tokens_per_pass'] / pl['tokens_per_pass']:.2f}x tokens per pass")


def overrides(pairs: list[str], cls: type) -> Any:
    kwargs = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        field = {f.name: f for f in dataclasses.fields(cls)}.get(key)
        if field is None:
            raise SystemExit(f"--{cls.__name__}: no field {key!r}")
        kwargs[key] = {"int": int, "float": float, "bool": lambda v: v.lower() in ("1", "true")}[str(field.type)](value)
    return cls(**kwargs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["repeated", "agent", "single"], choices=["repeated", "agent", "single"])
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8], help="lane counts (default 1 8; single always runs 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ignore-eos", action="store_true", help="generate max_tokens tokens whatever is drawn")
    ap.add_argument("--limit", type=int, default=1000, help="at most this many requests (agent: episodes) per workload, for a smoke run")
    ap.add_argument("--json", type=Path, default=Path("bench_drafting.json"))
    ap.add_argument("--replay", type=Path, help="replay recorded streams (no model): drafting statistics only")
    ap.add_argument("--arctic", type=Path, help="compare with ArcticInference's suffix cache on recorded streams (dev only)")
    ap.add_argument("--cost", action="store_true", help="drafting cost per token at 1k and at 32k history / 1M corpus (no model)")
    ap.add_argument("--row-cost", type=float, default=0.15, help="replay: a verify row's cost in passes, for the estimate (default 0.15)")
    ap.add_argument("--suffix", nargs="*", default=[], metavar="KEY=VALUE", help="SuffixConfig fields (replay, cost)")
    ap.add_argument("--prompt-lookup", nargs="*", default=[], metavar="KEY=VALUE", help="PromptLookupConfig fields (replay)")
    args = ap.parse_args(argv)

    if args.cost:
        report = cost(overrides(args.suffix, SuffixConfig))
        print_cost(report)
        args.json.write_text(json.dumps({"cost": report, "load": os.getloadavg()}))
        print(f"wrote {args.json}")
        return 0
    if args.arctic:
        print(json.dumps(compare_arctic(args.arctic, SuffixConfig().max_draft), indent=1))
        return 0
    if args.replay:
        configs = {"suffix": overrides(args.suffix, SuffixConfig), "prompt_lookup": overrides(args.prompt_lookup, PromptLookupConfig)}
        results = replay(args.replay, args.lanes, configs)
        print_table(results, args.row_cost)
        return 0

    from sf_trt.backends import BackendSpec
    from sf_trt.entrypoints.model import ModelSpec, resolve
    from sf_trt.generate import Generator
    from sf_trt.scheduler import DraftPolicy

    load_before = os.getloadavg()
    model = resolve(ModelSpec(weights="int8"), progress=True)
    prims = BackendSpec(threads=args.threads).open(model.model_dir.path, max_lanes=max(args.lanes), max_context=1024)
    tok = model.tokenizer
    gen = Generator(prims, tick_tokens=TICK_TOKENS, policy=DraftPolicy())  # every lane drafts: the drafters are compared

    def encode(messages: list[dict]) -> list[int]:
        return tok.encode_chat(messages)  # contents as text: earlier replies are model output

    bench = Bench(gen, encode, args.ignore_eos)
    from sf_trt.generate import Request

    gen.run([Request(encode(user("hello")), params=SamplingParams(max_tokens=4), speculate=False)])  # warm up
    results = {}
    t0 = time.perf_counter()
    for name in args.workloads:
        for lanes in ([1] if name == "single" else args.lanes):
            results[f"{name}/{lanes}"] = bench.workload(name, lanes, tok, args.limit)
            print(f"[{name}, {lanes} lane(s) done at {time.perf_counter() - t0:.0f}s, load {os.getloadavg()[0]:.1f}]", file=sys.stderr)
    load_after = os.getloadavg()
    print_table(results)
    print(f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}; outputs identical to plain: {'yes' if not bench.mismatches else 'NO'}")
    streams = {}
    for name, rows in bench.streams.items():  # each request once (the first lane count's run)
        seen = set()
        streams[name] = [s for s in rows if not (s["id"] in seen or seen.add(s["id"]))]
    args.json.write_text(json.dumps({
        "results": results, "load": [load_before, load_after], "mismatches": bench.mismatches,
        "settings": {"threads": args.threads, "ignore_eos": args.ignore_eos, "tick_tokens": TICK_TOKENS, "weights": "int8",
                     "suffix": dataclasses.asdict(SuffixConfig()), "prompt_lookup": dataclasses.asdict(PromptLookupConfig())},
        "vocab": prims.capabilities.vocab, "eos": prims.capabilities.eos, "streams": streams,
    }))
    print(f"wrote {args.json}")
    prims.close()
    if bench.mismatches:
        print(f"bench_drafting: outputs differ from plain: {', '.join(bench.mismatches)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
