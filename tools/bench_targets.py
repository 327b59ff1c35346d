#!/usr/bin/env python3
"""Issue 23's targets, measured in bounded steps: sf_trt beside llama.cpp and onnxruntime-genai.

    PEERS=peers-venv/bin/python     # onnxruntime-genai, llama-cpp-python, sf_trt (-e): docs/benchmarks.md
    $PEERS tools/bench_targets.py run --peers-dir peers --sf-trt-cmd "$(which sf-trt)" --json targets.json
    $PEERS tools/bench_targets.py table targets.json        # the issue's Targets, met or not, as markdown
    $PEERS tools/bench_targets.py quantize F16.gguf Q4_K_M.gguf   # llama.cpp's quantizer (llama_model_quantize)

``run`` measures each step of ``--steps`` (default: all, in this order; its estimate of the whole
run on a quiet 2-core machine is printed first) and writes the JSON after each, so a run cut
short keeps what it measured:

* ``peers-135m-spin`` / ``peers-135m-sleep``: tools/bench_peers.py on SmolLM2-135M (its Q4_1 GGUF
  for llama.cpp, onnxruntime-genai's int4 build of it, sf_trt's int8 export), the same prompt
  ids on every engine, prompt by prompt: plain decode and each engine's speculation (llama.cpp's
  prompt lookup, genai's n-gram, sf_trt's), with llama.cpp's and sf_trt's threads spinning
  (``OMP_WAIT_POLICY`` unset, ``sf-trt --spin``) or sleeping (``OMP_WAIT_POLICY=PASSIVE``); genai's
  threads always spin. Its bandwidth probe and each engine's fraction of the limit come with it.
* ``peers-1b-spin`` / ``peers-1b-sleep``: the same on the 1.1B TinyLlama-shaped random-weight
  model (``--peers-dir``/1b: llama.cpp's Q4_K_M GGUF, sf_trt's export of the F16 GGUF, genai's
  int4 where built), the prompts cut to their first ``SHORT_CHARS`` characters (its tokenizer has
  a piece per character); with random weights a draft is almost never taken, so its speculative
  rows measure the cost of drafting, not its gain.
* ``lanes-135m`` / ``lanes-1b``: ``sf-trt bench --lanes 8`` against ``--lanes 1`` on the same
  8 prompts: plain throughput over the same tokens.
* ``memory-1b``: the peak RSS of ``sf-trt generate`` on the 1.1B export (``os.wait4``'s
  ``ru_maxrss`` of that process) against its weights' bytes (every initializer of its graph).
* ``bandwidth``: the triad alone (tools/bench_peers.py's), for the record; the fractions come from
  each peers step's own probe, right after its runs.

``--repeats N`` times each prompt and mode N times on every engine (``sf-trt bench --repeats``
too) and counts the fastest: on a shared machine one run's ratios move by ±10%.

sf_trt's exports: at 135M the default model's int8 unless ``--sf-135m-model DIR``; at 1.1B
``--peers-dir``/1b/sf-WEIGHTS (``--sf-1b-weights``, default int8) unless ``--sf-1b-model DIR``.

Each step runs in its own process with a time limit (``--step-timeout``, default 3 × its estimate),
so a step that hangs is cut off and reported, and the next one runs. Where an engine or a model
is missing the step says so and goes on without it. ``table`` reads that JSON and prints the
Targets (ratios within one step's run, never across steps), each met, not met, or not measured
and why. Exit status: 0 done, 2 a missing prerequisite, 1 a step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
if str(TOOLS) not in sys.path:  # tools/ is no package
    sys.path.insert(0, str(TOOLS))

import bench_peers  # noqa: E402

BENCH_PROMPTS = TOOLS / "prompts" / "bench.jsonl"
PROMPTS_135M = ("typehints", "fix_typo", "rename", "story_lighthouse")
"""The prompts the peers steps run at 135M: three grounded (the speculative target is on grounded
prompts), one open."""
PROMPTS_1B = ("fix_typo", "vaccines")
SHORT_CHARS = 160
"""Characters of each prompt's message kept at 1.1B (the synthetic tokenizer: about a token each)."""
TOKENS_135M, TOKENS_1B = 64, 24
LANES = 8

# seconds each step should take on a quiet 2-core machine: estimated from the 135M rates in docs/benchmarks.md
# and the 1.1B models' bytes per token, not yet timed there (the limit is a multiple of it)
ESTIMATES = {
    "peers-135m-spin": 75, "peers-135m-sleep": 75, "peers-1b-spin": 120, "peers-1b-sleep": 120,
    "lanes-135m": 40, "lanes-1b": 90, "memory-1b": 30, "bandwidth": 10,
}
STEPS = tuple(ESTIMATES)


def estimate(name: str, repeats: int = 1) -> float:
    """Seconds step ``name`` should take with ``repeats`` timed runs of each prompt (the peers' and lanes'
    runs repeat; their model loads and warmups do not, so this is an upper bound)."""
    return ESTIMATES[name] * (repeats if name.startswith(("peers-", "lanes-")) else 1)

# the Targets: (key, the target as the issue words it, threshold, "ge" or "le")
TARGETS = {
    "plain_vs_llama.cpp": ("Plain decode ≥ 1.25× llama.cpp", 1.25, "ge"),
    "plain_vs_genai": ("Plain decode ≥ 1.0× onnxruntime-genai int4", 1.0, "ge"),
    "spec_vs_best": ("Speculative decode on grounded prompts ≥ 1.5× the best of llama.cpp's lookup and genai's n-gram", 1.5, "ge"),
    "bandwidth": ("Bandwidth ≥ 60% of the measured limit per token at 1.1B", 0.60, "ge"),
    "lanes-135m": ("8 lanes ≥ 4× one lane's plain throughput at 135M", 4.0, "ge"),
    "lanes-1b": ("8 lanes ≥ 2.5× one lane's plain throughput at 1.1B", 2.5, "ge"),
    "memory": ("Peak RSS of `sf-trt generate` at 1.1B ≤ 1.3× its weights' bytes", 1.3, "le"),
}


def say(msg: str) -> None:
    print(f"bench_targets: {msg}", file=sys.stderr, flush=True)


class Missing(Exception):
    """A model or engine a step needs is not there (the step is skipped, with this note)."""


# -- the models ------------------------------------------------------------------


class Models:
    """Where each step's models are: ``--peers-dir`` (genai-135m/int4, 1b/...) and the sf_trt cache."""

    def __init__(self, args) -> None:
        self.dir = args.peers_dir
        self.gguf_135m = args.gguf_135m
        self.sf_1b_weights = args.sf_1b_weights
        self.sf_135m_model = args.sf_135m_model
        self.sf_1b_model = args.sf_1b_model

    @property
    def genai_135m(self) -> Path | None:
        d = self.dir / "genai-135m" / "int4"
        return d if (d / "genai_config.json").is_file() else None

    def sf_135m(self) -> list[str]:
        """``sf-trt bench``'s arguments for the 135M model: ``--sf-135m-model``, else none (the default model's int8)."""
        return [] if self.sf_135m_model is None else ["--model", str(self.need(self.sf_135m_model, "sf_trt's 135M export"))]

    @property
    def gguf_1b(self) -> Path:
        return self.dir / "1b" / "tinyllama-1.1b.Q4_K_M.gguf"

    @property
    def sf_1b(self) -> Path:
        return self.sf_1b_model or self.dir / "1b" / f"sf-{self.sf_1b_weights}"

    @property
    def genai_1b(self) -> Path | None:
        d = self.dir / "1b" / "genai-int4"
        return d if (d / "genai_config.json").is_file() else None

    def need(self, path: Path, what: str) -> Path:
        if not path.exists():
            raise Missing(f"{what}: no {path} (docs/benchmarks.md, \"Issue 23's targets\", has the commands that make it)")
        return path


# -- steps -------------------------------------------------------------------------


def prompts_file(ids: tuple[str, ...], chars: int | None, max_tokens: int, where: Path) -> Path:
    """The bench prompts of ``ids``, each message cut to ``chars`` characters (None: whole),
    ``max_tokens`` each, written to ``where``."""
    rows = {json.loads(line)["id"]: json.loads(line) for line in BENCH_PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip()}
    unknown = sorted(set(ids) - set(rows))
    if unknown:
        raise SystemExit(f"bench_targets: no prompt(s) {unknown} in {BENCH_PROMPTS}")
    with open(where, "w", encoding="utf-8") as f:
        for pid in ids:
            p = dict(rows[pid], max_tokens=max_tokens)
            if chars is not None:
                p["messages"] = [dict(m, content=m["content"][:chars]) for m in p["messages"]]
            f.write(json.dumps(p) + "\n")
    return where


def run_process(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str, Any]:
    """``cmd`` in its own process, cut off after ``timeout`` s: (exit status or None when cut off,
    stdout, stderr, its resource usage from ``os.wait4``: peak RSS of that process alone)."""
    say(f"running {shlex.join(cmd)}")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        status = usage = None
        while True:
            pid, wstatus, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status = os.waitstatus_to_exitcode(wstatus)
                proc.returncode = status
                break
            if time.monotonic() > deadline:
                proc.kill()
                _pid, _wstatus, usage = os.wait4(proc.pid, 0)
                proc.returncode = -9
                break
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return status, out.read().decode(errors="replace"), err.read().decode(errors="replace"), usage


def peers_step(size: str, spin: bool, models: Models, args, work: Path, timeout: float) -> dict[str, Any]:
    """tools/bench_peers.py with every engine there is, at ``size``, threads spinning or sleeping."""
    cmd = [sys.executable, str(TOOLS / "bench_peers.py"), "--threads", str(args.threads), "--sf-trt", "--sf-trt-cmd", args.sf_trt_cmd,
           "--warmup", "1", "--repeats", str(args.repeats), "--json", str(work / f"peers-{size}-{'spin' if spin else 'sleep'}.json")]
    peers, notes = ["llama.cpp"], []
    if size == "135m":
        cmd += ["--prompts", str(prompts_file(PROMPTS_135M, None, args.max_tokens or TOKENS_135M, work / "prompts-135m.jsonl"))]
        if models.gguf_135m:
            cmd += ["--gguf", str(models.gguf_135m)]
        if models.sf_135m():
            cmd += ["--sf-trt-args", shlex.join(models.sf_135m()), "--sf-trt-model", str(models.sf_135m_model)]
        genai = models.genai_135m
        genai_where = models.dir / "genai-135m" / "int4"
    else:
        gguf, sf = models.need(models.gguf_1b, "llama.cpp's Q4_K_M GGUF"), models.need(models.sf_1b, "sf_trt's 1.1B export")
        cmd += ["--prompts", str(prompts_file(PROMPTS_1B, SHORT_CHARS, args.max_tokens or TOKENS_1B, work / "prompts-1b.jsonl")),
                "--gguf", str(gguf), "--sf-trt-args", f"--model {sf}", "--sf-trt-model", str(sf)]
        genai = models.genai_1b
        genai_where = models.dir / "1b" / "genai-int4"
    if genai is not None:
        peers.append("genai")
        cmd += ["--genai-model", str(genai)]
    else:
        notes.append(f"genai left out: no {genai_where}/genai_config.json")
    cmd += ["--peers", ",".join(peers)]
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if not spin:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    status, out, err, _usage = run_process(cmd, timeout, env)
    report_path = work / f"peers-{size}-{'spin' if spin else 'sleep'}.json"
    if status is None:
        return {"status": "cut off", "note": f"past {timeout:.0f} s", "command": shlex.join(cmd), "notes": notes}
    if status != 0 or not report_path.is_file():
        return {"status": "failed", "note": f"exit {status}: " + " | ".join(err.strip().splitlines()[-6:]), "command": shlex.join(cmd), "notes": notes}
    report = json.loads(report_path.read_text(encoding="utf-8"))
    for r in report.get("results", []):  # the token ids are the bulk and no target reads them
        for peer in r.get("peers", {}).values():
            for mode in ("plain", "lookup"):
                peer.get(mode, {}).pop("ids", None)
    print(out, end="")
    return {"status": "ok", "command": shlex.join(cmd), "notes": notes, "report": report}


def sf_bench(args, prompts: Path, extra: list[str], timeout: float) -> dict[str, Any]:
    """One ``sf-trt bench --json`` run on ``prompts`` (tools/bench_peers.py's runner)."""
    rows = [json.loads(line) for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    doc, note = bench_peers.run_sf_trt(shlex.split(args.sf_trt_cmd), rows, args.threads, False, timeout, extra, repeats=args.repeats)
    if doc is None:
        raise RuntimeError(note)
    return {"command": note, "throughput_tokens_per_s": doc.get("throughput_tokens_per_s"),
            "decode_tokens_per_s": doc.get("decode_tokens_per_s"), "prefill_seconds": doc.get("prefill_seconds"),
            "settings": doc.get("settings"), "identical": sum(bool(r.get("identical")) for r in doc.get("results", [])),
            "prompts": len(doc.get("results", []))}


def lanes_step(size: str, models: Models, args, work: Path, timeout: float) -> dict[str, Any]:
    """``sf-trt bench`` on the same 8 prompts with 8 lanes and with 1: the plain throughputs' ratio."""
    ids = tuple(json.loads(line)["id"] for line in BENCH_PROMPTS.read_text(encoding="utf-8").splitlines() if line.strip())[:LANES]
    if size == "135m":
        prompts, extra = prompts_file(ids, None, args.max_tokens or TOKENS_135M // 2, work / "lanes-135m.jsonl"), models.sf_135m()
    else:
        sf = models.need(models.sf_1b, "sf_trt's 1.1B export")
        prompts, extra = prompts_file(ids, SHORT_CHARS, args.max_tokens or TOKENS_1B // 2, work / "lanes-1b.jsonl"), ["--model", str(sf)]
    runs = {}
    for lanes in (LANES, 1):
        runs[str(lanes)] = sf_bench(args, prompts, extra + ["--lanes", str(lanes)], timeout / 2)
    one, many = runs["1"]["throughput_tokens_per_s"]["plain"], runs[str(LANES)]["throughput_tokens_per_s"]["plain"]
    return {"status": "ok", "runs": runs, "lanes": LANES, "ratio_plain": many / one if one else None,
            "ratio_plain_decode": _ratio(runs[str(LANES)]["decode_tokens_per_s"]["plain"], runs["1"]["decode_tokens_per_s"]["plain"]),
            "sf_trt_spin": bench_peers.sf_trt_spins()}


def _ratio(many: float | None, one: float | None) -> float | None:
    """``many / one`` where both rates are given (``sf-trt bench`` gives none for a run that is nearly all prefill)."""
    return many / one if isinstance(many, (int, float)) and isinstance(one, (int, float)) and one else None


def memory_step(models: Models, args, timeout: float) -> dict[str, Any]:
    """``sf-trt generate`` on the 1.1B export, 16 tokens: its peak RSS over its weights' bytes."""
    sf = models.need(models.sf_1b, "sf_trt's 1.1B export")
    weights = bench_peers.onnx_bytes_per_token(sf / "decoder_pass.onnx")
    weight_bytes = weights["bytes_per_token"] + weights["gathered_tables_bytes"]
    cmd = shlex.split(args.sf_trt_cmd) + ["generate", "--model", str(sf), "--prompt-ids", ",".join(str(i) for i in range(40, 104)),
                                          "--max-tokens", "16", "--ignore-eos", "--threads", str(args.threads)]
    status, _out, err, usage = run_process(cmd, timeout)
    if status != 0:
        return {"status": "failed" if status is not None else "cut off", "command": shlex.join(cmd),
                "note": f"exit {status}: " + " | ".join(err.strip().splitlines()[-4:])}
    peak = usage.ru_maxrss * 1024  # KiB on Linux
    return {"status": "ok", "command": shlex.join(cmd), "peak_rss_bytes": peak, "weight_bytes": weight_bytes,
            "ratio": peak / weight_bytes, "weights": weights}


def bandwidth_step(args) -> dict[str, Any]:
    return {"status": "ok", "bandwidth": bench_peers.machine_bandwidth(args.threads, args.bandwidth_mib)}


def run_step(name: str, models: Models, args, work: Path) -> dict[str, Any]:
    timeout = args.step_timeout or 3 * estimate(name, args.repeats)
    try:
        if name.startswith("peers-"):
            _, size, policy = name.split("-")
            return peers_step(size, policy == "spin", models, args, work, timeout)
        if name.startswith("lanes-"):
            return lanes_step(name.split("-")[1], models, args, work, timeout)
        if name == "memory-1b":
            return memory_step(models, args, timeout)
        return bandwidth_step(args)
    except Missing as exc:
        return {"status": "skipped", "note": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one step's failure is reported and the next runs
        return {"status": "failed", "note": f"{type(exc).__name__}: {exc}"}


def cmd_run(args) -> int:
    steps = parse_steps(args.steps)
    if shutil.which(shlex.split(args.sf_trt_cmd)[0]) is None and not Path(shlex.split(args.sf_trt_cmd)[0]).is_file():
        print(f"bench_targets: --sf-trt-cmd {args.sf_trt_cmd!r}: no such command", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print(f"bench_targets: --repeats {args.repeats}: give 1 or more", file=sys.stderr)
        return 2
    total = sum(estimate(s, args.repeats) for s in steps)
    say(f"steps {', '.join(steps)}: about {total / 60:.1f} min on a quiet 2-core machine "
        f"(each cut off after {'%.0f s' % args.step_timeout if args.step_timeout else '3x its estimate'})")
    models = Models(args)
    doc: dict[str, Any] = {"tool": "tools/bench_targets.py", "threads": args.threads, "max_tokens": args.max_tokens, "peers_dir": str(args.peers_dir),
                           "sf_trt_cmd": args.sf_trt_cmd, "cpu_count": os.cpu_count(), "estimate_s": total, "repeats": args.repeats, "steps": {}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_targets_") as tmp:
        work = Path(tmp)
        for name in steps:
            load_before = os.getloadavg()
            t0 = time.perf_counter()
            result = run_step(name, models, args, work)
            result.update(seconds=round(time.perf_counter() - t0, 1), loadavg_before=load_before, loadavg_after=os.getloadavg())
            doc["steps"][name] = result
            failed |= result["status"] in ("failed", "cut off")
            say(f"{name}: {result['status']} in {result['seconds']:.0f} s" + (f" ({result['note']})" if result.get("note") else ""))
            args.json_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(render_table(doc))
    say(f"wrote {args.json_path}")
    return 1 if failed else 0


def parse_steps(text: str | None) -> list[str]:
    if not text:
        return list(STEPS)
    steps = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in steps if s not in ESTIMATES]
    if unknown or not steps:
        raise SystemExit(f"bench_targets: --steps: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(STEPS)})")
    return [s for s in STEPS if s in steps]


# -- the table ---------------------------------------------------------------------


def _rate(runs: list[dict]) -> float | None:
    """Tokens over seconds summed over ``runs`` (each with "tokens" and "tokens_per_s")."""
    runs = [r for r in runs if r.get("tokens_per_s")]
    return sum(r["tokens"] for r in runs) / sum(r["tokens"] / r["tokens_per_s"] for r in runs) if runs else None


def spec_rates(report: dict, kind: str = "grounded") -> dict[str, float | None]:
    """Each engine's speculative tok/s over the prompts of ``kind`` (prefill included, as each run counts)."""
    rows = [r for r in report.get("results", []) if r.get("kind") == kind]
    out = {name: _rate([r["peers"][name]["lookup"] for r in rows]) for name in (report.get("settings") or {}).get("peers", [])}
    sf = [r["sf_trt"] for r in rows if r.get("sf_trt")]
    out["sf_trt"] = _rate([{"tokens": s["spec_tokens"], "tokens_per_s": s["spec_tokens_per_s"]} for s in sf]) if sf else None
    return out


def exactness(report: dict) -> dict[str, str]:
    """Each engine's speculative output equal to its own plain output, as "k/n" prompts."""
    rows = report.get("results", [])
    out = {name: f"{sum(bool(r['peers'][name]['identical']) for r in rows)}/{len(rows)}" for name in (report.get("settings") or {}).get("peers", [])}
    sf = [r["sf_trt"] for r in rows if r.get("sf_trt")]
    if sf:
        out["sf_trt"] = f"{sum(bool(s.get('identical')) for s in sf)}/{len(sf)}"
    return out


def target_rows(doc: dict) -> list[dict[str, Any]]:
    """The Targets as rows: target, where, measured (a number or None), met (True/False/None), note."""
    steps = doc.get("steps", {})
    rows: list[dict[str, Any]] = []

    def add(key: str, where: str, value: float | None, note: str = "") -> None:
        _text, threshold, sense = TARGETS[key]
        met = None if value is None else (value >= threshold if sense == "ge" else value <= threshold)
        rows.append({"target": key, "where": where, "measured": value, "met": met, "note": note})

    for size in ("135m", "1b"):
        for policy in ("spin", "sleep"):
            name = f"peers-{size}-{policy}"
            step = steps.get(name)
            where = f"{'135M' if size == '135m' else '1.1B'}, threads {policy}"
            if step is None or step.get("status") != "ok":
                why = "not run" if step is None else f"{step.get('status')}: {step.get('note', '')}"
                for key in ("plain_vs_llama.cpp", "plain_vs_genai", "spec_vs_best"):
                    add(key, where, None, why)
                continue
            report = step["report"]
            engines = report.get("limit", {}).get("engines", {})
            sf = (engines.get("sf_trt") or {}).get("tokens_per_s")
            for peer in ("llama.cpp", "genai"):
                theirs = (engines.get(peer) or {}).get("tokens_per_s")
                note = "decode only, all prompts" if theirs else f"{peer} not in this run"
                add(f"plain_vs_{peer}", where, sf / theirs if sf and theirs else None, note)
            spec = spec_rates(report)
            peers = {k: v for k, v in spec.items() if k != "sf_trt" and v}
            best = max(peers, key=peers.get) if peers else None
            exact = ", ".join(f"{k} {v}" for k, v in exactness(report).items())
            note = (f"best peer {best}; exact (spec == plain): {exact}" if best else "no peer's speculation ran") + (
                "; random weights: drafts are rarely taken" if size == "1b" else "")
            add("spec_vs_best", where, spec["sf_trt"] / peers[best] if best and spec.get("sf_trt") else None, note)
    for policy in ("spin", "sleep"):
        step = steps.get(f"peers-1b-{policy}")
        row = ((step or {}).get("report") or {}).get("limit", {}).get("engines", {}).get("sf_trt") or {}
        bw = ((step or {}).get("report") or {}).get("limit", {}).get("bandwidth", {}).get("bytes_per_s")
        note = (f"{row['tokens_per_s']:.1f} tok/s x {row['bytes_per_token'] / 1e6:.0f} MB / {bw / 1e9:.1f} GB/s"
                if row.get("fraction_of_limit") and bw else ("not run" if step is None else f"{step.get('status')}: {step.get('note', 'no sf_trt rate')}"))
        if (row.get("fraction_of_limit") or 0) > 1:
            note += "; above 100%: not a decode rate (too few tokens for sf-trt bench's rounded rates?)"
        add("bandwidth", f"1.1B, threads {policy}", row.get("fraction_of_limit"), note)
    for size in ("135m", "1b"):
        step = steps.get(f"lanes-{size}")
        ok = step is not None and step.get("status") == "ok"
        note = (f"plain tok/s {step['runs'][str(LANES)]['throughput_tokens_per_s']['plain']} ({LANES} lanes) / "
                f"{step['runs']['1']['throughput_tokens_per_s']['plain']} (1 lane), prefill included; decode only "
                f"{fmt_ratio(step.get('ratio_plain_decode'))}") if ok else (
            "not run" if step is None else f"{step.get('status')}: {step.get('note', '')}")
        add(f"lanes-{size}", "135M" if size == "135m" else "1.1B", step.get("ratio_plain") if ok else None, note)
    step = steps.get("memory-1b")
    ok = step is not None and step.get("status") == "ok"
    note = (f"{step['peak_rss_bytes'] / 1e9:.2f} GB peak / {step['weight_bytes'] / 1e9:.2f} GB weights" if ok
            else ("not run" if step is None else f"{step.get('status')}: {step.get('note', '')}"))
    add("memory", "1.1B", step.get("ratio") if ok else None, note)
    return rows


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def render_table(doc: dict) -> str:
    lines = ["| target | where | measured | met | note |", "|---|---|---:|---|---|"]
    for r in target_rows(doc):
        text, _threshold, _sense = TARGETS[r["target"]]
        value = r["measured"]
        shown = f"{100 * value:.0f}%" if r["target"] == "bandwidth" and value is not None else fmt_ratio(value)
        met = "not measured" if r["met"] is None else ("met" if r["met"] else "not met")
        lines.append(f"| {text} | {r['where']} | {shown} | {met} | {r['note']} |")
    return "\n".join(lines)


def cmd_table(args) -> int:
    try:
        doc = json.loads(args.json_in.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        print(f"bench_targets: {args.json_in}: expected the JSON of `bench_targets.py run`, got {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), dict):
        print(f"bench_targets: {args.json_in}: expected an object with \"steps\" (the JSON of `bench_targets.py run`)", file=sys.stderr)
        return 2
    print(render_table(doc))
    return 0


# -- llama.cpp's quantizer -----------------------------------------------------------


def cmd_quantize(args) -> int:
    """``llama_model_quantize``, the function llama.cpp's ``llama-quantize`` calls, through llama-cpp-python."""
    bench_peers.preload_llama_cpp_shim()
    try:
        import llama_cpp
    except ImportError as exc:
        print(f"bench_targets: quantize needs llama-cpp-python ({exc}); docs/benchmarks.md has the venv", file=sys.stderr)
        return 2
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}", None)
    if ftype is None:
        known = sorted(k[len("LLAMA_FTYPE_MOSTLY_"):] for k in dir(llama_cpp) if k.startswith("LLAMA_FTYPE_MOSTLY_"))
        print(f"bench_targets: --type {args.type}: not a llama.cpp file type (known: {', '.join(known)})", file=sys.stderr)
        return 2
    if not args.src.is_file():
        print(f"bench_targets: {args.src}: no such GGUF", file=sys.stderr)
        return 2
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, args.threads
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(args.src).encode(), str(args.dst).encode(), params)
    if rc != 0:
        print(f"bench_targets: llama_model_quantize({args.src} -> {args.dst}, {args.type}) returned {rc}", file=sys.stderr)
        return 1
    say(f"wrote {args.dst} ({args.type}, {args.dst.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="measure the steps, write the JSON, print the table")
    run.add_argument("--steps", help=f"comma-separated, of {', '.join(STEPS)} (default: all)")
    run.add_argument("--peers-dir", type=Path, default=Path("peers"),
                     help="the peers' models: genai-135m/int4, 1b/tinyllama-1.1b.Q4_K_M.gguf, 1b/sf-int8, 1b/genai-int4 (default ./peers)")
    run.add_argument("--gguf-135m", type=Path, help="SmolLM2-135M's GGUF (default: tools/bench_peers.py's, under $SF_TRT_CACHE)")
    run.add_argument("--sf-1b-weights", default="int8", choices=("int8", "q4", "int4", "gguf", "float32"),
                     help="which 1.1B export (1b/sf-WEIGHTS) sf_trt runs (default int8; gguf is what --weights auto picks for the Q4_K_M file; "
                     "int4, from the F16 file, is genai's int4 form)")
    run.add_argument("--sf-1b-model", type=Path, metavar="DIR", help="the 1.1B export sf_trt runs, instead of 1b/sf-WEIGHTS")
    run.add_argument("--sf-135m-model", type=Path, metavar="DIR",
                     help="the 135M export sf_trt runs (default: the default model's, int8; e.g. `sf-trt export --weights int4 --out DIR`)")
    run.add_argument("--sf-trt-cmd", required=True,
                     help="the sf-trt command line of the install being measured (its own venv's, not this interpreter's: "
                     "the peers' venv holds sf_trt only for its tokenizer)")
    run.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every engine (default: all cores)")
    run.add_argument("--max-tokens", type=int, help="new tokens per prompt of every step (default: each step's own, "
                     f"{TOKENS_135M} at 135M, {TOKENS_1B} at 1.1B, half of that in the lanes steps); a smaller number for a quick check")
    run.add_argument("--repeats", type=int, default=1, help="timed runs of each prompt and mode on every engine, the fastest "
                     "counted (default 1; 3 steadies a shared machine's ratios, at about 2x each step's time)")
    run.add_argument("--step-timeout", type=float, help="seconds each step may take (default: 3x its estimate)")
    run.add_argument("--bandwidth-mib", type=int, default=64, help="MiB per array of the bandwidth step's triad (default 64)")
    run.add_argument("--json", dest="json_path", type=Path, default=Path("bench_targets.json"), help="write here (default bench_targets.json)")
    table = sub.add_parser("table", help="print the Targets of a run's JSON as a markdown table")
    table.add_argument("json_in", type=Path)
    quant = sub.add_parser("quantize", help="llama.cpp's quantizer on a GGUF (llama_model_quantize)")
    quant.add_argument("src", type=Path)
    quant.add_argument("dst", type=Path)
    quant.add_argument("--type", default="Q4_K_M", help="llama.cpp's file type (default Q4_K_M)")
    quant.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    return {"run": cmd_run, "table": cmd_table, "quantize": cmd_quantize}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
