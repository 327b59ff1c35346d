"""Time to first token per turn of a growing conversation, with the prefix cache on and off.

Two workloads, each a conversation whose every turn sends the whole conversation again:

* chat: a system prompt, then turns of a user message and the assistant's reply, the
  context growing to about ``--context`` tokens at the last turn;
* agent: a task, then steps of the model's (tool-call-like) reply and a tool-like
  observation (JSON lines, listings), growing the same way.

Two `sf-trt serve` run side by side (``--max-num-seqs --concurrency``), one with the
cache (``--prefix-cache-mb``) and one without (0). The script runs one chat and one agent
conversation alone, then ``--concurrency`` conversations at once (half chat, half agent,
each its own ``user``, turn by turn in step), streaming every turn and timing its first
token. Each turn runs on both servers back to back (which one first alternates), so a
change in the machine's load hits both alike. Greedy, so the answers must be the same
with the cache on and off, and are checked to be. Prints the median time to first token
per turn, the throughput under the mixed load (output tokens over the time that server
spent on the concurrent turns), and each server's peak RSS (VmHWM), and writes the
numbers as JSON.

    python tools/bench_prefix_cache.py --context 4096 --turns 8 --concurrency 8 --json bench_prefix_cache.json

Another model: ``--model DIR`` or ``--gguf PATH`` (both servers serve it). A random-weight
model (``tools/synthetic_gguf.py``) writes nonsense text, so ``--token-prompts`` drives it
with token ids instead: one conversation of random ids, ``/v1/completions``, each turn
adding the reply's ids and as many new ones as the context allows. ``--off-turns 1,8`` has
the server without the cache run only those turns (its turns cost the whole conversation
each: a large model's run fits in minutes this way). Beside the measured ratio of the last
turn's time to first token over the first's, the script prints the ratio the model's
arithmetic predicts (:func:`predicted_cost`): each new row costs its matmuls plus attention
over the keys before it, so with the cache the last turn's floor is above 1x by as much as
attention over the whole context weighs against the weights. It counts every FLOP alike; on a
CPU the attention's run in float32 and the weights' in int8, about twice as fast a FLOP
(``tools/bench_fusions.py --ops`` measures both rates), so the measured ratio sits above it.

    python tools/synthetic_gguf.py /tmp/tinyllama.gguf --shape tinyllama-1.1b --context 8192
    python tools/bench_prefix_cache.py --gguf /tmp/tinyllama.gguf --token-prompts --context 4096 --turns 8 --max-tokens 16 --off-turns 1,8 --alone-only

The machine may be shared: read the ratios measured in one run, not the absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import start_server, stop_server  # noqa: E402

WORDS = (
    "the model reads a file and writes a short answer about what changed in the project since last week while "
    "tests run on two cores and the server keeps every lane busy with prompts from users who ask about trains "
    "rivers maps recipes budgets invoices weather reports and small programs that sort lists parse dates or "
    "count words in long documents before they summarise the result for a team meeting on monday"
).split()


def text(rng: random.Random, words: int) -> str:
    out = []
    for i in range(words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def observation(rng: random.Random, words: int) -> str:
    lines = []
    while sum(len(line.split()) for line in lines) < words:
        name = f"{rng.choice(WORDS)}_{rng.randrange(1000)}.py"
        lines.append(json.dumps({"path": f"src/{rng.choice(WORDS)}/{name}", "lines": rng.randrange(10, 900), "summary": text(rng, 8)}))
    return "Observation from list_files():\n" + "\n".join(lines)


class Conversation:
    """One conversation's messages; ``next_turn()`` adds the next user message or observation."""

    def __init__(self, kind: str, seed: int, turn_words: int, user: str) -> None:
        self.kind, self.user, self.turn_words = kind, user, turn_words
        self.rng = random.Random(seed)
        system = ("You are a careful assistant. Answer briefly." if kind == "chat" else
                  "You are an agent. Call one tool per step as list_files(), read(path) or done(answer); reply with the call only.")
        self.messages = [{"role": "system", "content": system}]

    def next_turn(self) -> None:
        if self.kind == "chat":
            content = "Here is more context. " + text(self.rng, self.turn_words) + " What is the main point?"
        else:
            content = observation(self.rng, self.turn_words)
        self.messages.append({"role": "user", "content": content})


class TokenConversation:
    """One conversation of token ids (``--token-prompts``): each turn adds ``turn_tokens``
    random ids from ``ids`` (a range of the vocabulary, no special tokens); the replies'
    ids are added by the workload as they come."""

    kind = "tokens"

    def __init__(self, seed: int, turn_tokens: int, user: str, ids: range) -> None:
        self.user, self.turn_tokens, self.ids = user, turn_tokens, ids
        self.rng = random.Random(seed)
        self.tokens: list[int] = []

    def next_turn(self) -> None:
        self.tokens += [self.rng.randrange(self.ids.start, self.ids.stop) for _ in range(self.turn_tokens)]

    def add_reply(self, reply: list[int]) -> None:
        self.tokens += reply


def predicted_cost(cfg, prompt_tokens: list[float], cached_tokens: list[float]) -> list[float]:
    """The arithmetic of each turn's prefill in FLOPs: its new rows (prompt less cached), each
    a pass over the decoder's matmul weights (``2 * params``) and attention over the keys of
    its pass (``4 * n_layers * n_heads * head_dim`` a key: q·k and the weighted sum of v; a
    pass reads the keys up to its end, so the turn's prompt length). ``cfg``: the model's
    :class:`~sf_trt.formats.model_dir.LlamaConfig`."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    weights = 2 * cfg.n_layers * (cfg.hidden * (q + 2 * kv) + q * cfg.hidden + 3 * cfg.hidden * cfg.ffn)
    per_key = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    return [(p - c) * (weights + per_key * p) for p, c in zip(prompt_tokens, cached_tokens)]


def model_config(args):
    """The served model's shape (for :func:`predicted_cost`): from ``--model``'s config, ``--gguf``'s
    header, else the default model's."""
    if args.gguf is not None:
        import gguf

        from sf_trt.export.gguf_llama import read_config

        return read_config(gguf.GGUFReader(str(args.gguf)))
    from sf_trt.formats.model_dir import ModelDir

    if args.model is not None:
        return ModelDir.open(args.model).config
    from sf_trt.export.pipeline import default_model_dir

    return ModelDir.open(default_model_dir(progress=False)).config


def model_flags(args) -> list[str]:
    return ["--model", str(args.model)] if args.model else ["--gguf", str(args.gguf)] if args.gguf else []


async def turn(client: httpx.AsyncClient, url: str, conv, max_tokens: int) -> dict:
    """Stream one turn; its time to first token, prompt tokens, cached tokens and reply (text,
    or token ids for a :class:`TokenConversation`)."""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "user": conv.user}
    by_ids = isinstance(conv, TokenConversation)
    # a random model's end token comes whenever: ignore it, every reply is max_tokens long
    body.update({"prompt": conv.tokens, "sf_trt": {"return_token_ids": True, "ignore_eos": True}} if by_ids else {"messages": conv.messages})
    t0 = time.perf_counter()
    ttft, reply, usage = None, [], None
    async with client.stream("POST", f"{url}/v1/{'completions' if by_ids else 'chat/completions'}", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"the server answered {r.status_code}: {await r.aread()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice.get("token_ids") if by_ids else choice.get("delta", {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    reply.extend(piece) if by_ids else reply.append(piece)
    return {"ttft_s": ttft if ttft is not None else time.perf_counter() - t0, "prompt_tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"], "completion_tokens": usage["completion_tokens"],
            "reply": reply if by_ids else "".join(reply)}


async def workload(urls: dict[str, str], args, concurrent: bool) -> dict:
    """Alone: one chat conversation, then one agent conversation. Concurrent: ``--concurrency``
    conversations at once, half of each kind, turn by turn in step. Every turn runs on each
    server (cache on, cache off) back to back, which goes first alternating, so both see the
    machine's load alike; their answers must be the same."""
    first = 100 if concurrent else 0  # conversations of their own: nothing cached from the run alone
    if args.token_prompts:
        kinds = ["tokens"] * (args.concurrency if concurrent else 1)
        convs = [TokenConversation(first + i, args.turn_tokens, f"user-{first + i}", args.token_ids) for i in range(len(kinds))]
    else:
        kinds = ["chat", "agent"] * (args.concurrency // 2) + ["chat"] * (args.concurrency % 2) if concurrent else ["chat", "agent"]
        convs = [Conversation(kind, seed=first + i, turn_words=args.turn_words[kind], user=f"user-{first + i}") for i, kind in enumerate(kinds)]
    groups = [convs] if concurrent else [[c] for c in convs]
    turns = {name: {id(c): [] for c in convs} for name in urls}
    wall = dict.fromkeys(urls, 0.0)
    async with httpx.AsyncClient(timeout=3600) as client:
        for url in urls.values():  # the client's first request sets it up (a connection, lazy imports): not in a turn's time
            await client.get(f"{url}/health")
        for group in groups:
            for k in range(args.turns):
                for conv in group:
                    conv.next_turn()
                replies = {}
                # which server goes first alternates by turn and by conversation: the first to
                # answer after idling pays for waking up
                for name in (list(urls) if (k + groups.index(group)) % 2 == 0 else list(urls)[::-1]):
                    if name == "off" and args.off_turns and k + 1 not in args.off_turns:
                        for conv in group:
                            turns[name][id(conv)].append(None)  # not run: the turn costs the off server the whole conversation
                        continue
                    t0 = time.perf_counter()
                    done = await asyncio.gather(*(turn(client, urls[name], c, args.max_tokens) for c in group))
                    wall[name] += time.perf_counter() - t0
                    for conv, result in zip(group, done):
                        turns[name][id(conv)].append(result)
                    replies[name] = [r["reply"] for r in done]
                if len(set(repr(r) for r in replies.values())) != 1:
                    raise SystemExit(f"turn {k + 1}: the answers differ with the cache on and off: {replies}")
                for conv, reply in zip(group, replies["on"]):
                    conv.add_reply(reply) if args.token_prompts else conv.messages.append({"role": "assistant", "content": reply})
    out = {}
    for name in urls:
        results = [turns[name][id(c)] for c in convs]
        output = sum(t["completion_tokens"] for r in results for t in r if t is not None)
        out[name] = {"kinds": kinds, "turns": results, "wall_s": wall[name], "output_tokens": output, "output_tok_s": output / wall[name]}
    return out


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tokens_per_word(url: str) -> dict[str, float]:
    """The served tokenizer's tokens per word of a chat turn's text and of an observation, from usage."""
    rng, ratios = random.Random(99), {}
    for kind, content in (("chat", text(rng, 100)), ("agent", observation(rng, 100))):
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "user": "calibration"}
        usage = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()["usage"]
        ratios[kind] = usage["prompt_tokens"] / len(content.split())
    return ratios


def warm_up(url: str, ids: range, n: int) -> None:
    """A request of ``n`` prompt tokens (scope of its own): the server's first passes of that size are behind it."""
    body = {"prompt": [ids[(7 * i) % len(ids)] for i in range(n)], "max_tokens": 4, "user": "calibration"}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    if r.status_code != 200:
        raise SystemExit(f"the server answered {r.status_code}: {r.text}")


def run(args) -> dict:
    """Both servers up (the cache on, and off), the workloads alone then concurrent."""
    procs, urls = {}, {}
    try:
        for name, mb in (("on", args.prefix_cache_mb), ("off", 0)):
            flags = ["--prefix-cache-mb", str(mb), "--speculate", args.speculate, *model_flags(args), *args.serve_flag]
            procs[name], urls[name] = start_server(args.concurrency, args.context + args.max_tokens + 256, flags)
            if not args.token_prompts:
                per_word = tokens_per_word(urls[name])
        for name in urls:  # both warmed up now, with a first turn's size: turn 1 then compares the cache's own cost
            warm_up(urls[name], args.token_ids, args.context // args.turns)
        if args.token_prompts:
            args.turn_tokens = max(8, (args.context - args.turns * args.max_tokens) // args.turns)
        else:
            budget = args.context - 96 - args.turns * (args.max_tokens + 16)  # the template's tokens per turn, about
            args.turn_words = {kind: max(8, int(budget / args.turns / r)) for kind, r in per_word.items()}
        alone = asyncio.run(workload(urls, args, concurrent=False))
        loaded = None if args.alone_only else asyncio.run(workload(urls, args, concurrent=True))
        rss = {name: peak_rss_mb(proc.pid) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop_server(proc)
    return {name: {"prefix_cache_mb": args.prefix_cache_mb if name == "on" else 0, "alone": alone[name],
                   "concurrent": loaded[name] if loaded else None,
                   "peak_rss_mb": rss[name]} for name in urls}


def new_rows_cost(context: int, rows: int = 200, repeats: int = 3) -> dict:
    """What a cached turn still pays: the fastest of ``repeats`` passes of ``rows`` new rows after
    0, half the context and nearly all of it already held (by start), and what saving and
    loading a whole lane's blocks takes (``save_s``, ``load_s``, ``blocks``); the decoder
    alone, default model."""
    import numpy as np

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.primitives import Rows

    starts = (0, context // 2 - rows, context - rows)
    tokens = np.random.default_rng(0).integers(0, 40000, context)
    best = dict.fromkeys(starts, float("inf"))
    with OrtDecoderPrimitives(default_model_dir(progress=False), max_lanes=1, max_context=context + 1) as prims:
        def run(start: int, n: int) -> float:
            r = Rows(np.zeros(n, np.int64), np.arange(start, start + n), tokens[start:start + n], np.array([n - 1]))
            t0 = time.perf_counter()
            prims.forward(r)
            return time.perf_counter() - t0

        def fill(start: int) -> None:  # the lane holds the whole context again
            for at in range(start, context, 256):
                run(at, min(256, context - at))

        fill(0)
        for _ in range(repeats):
            for start in sorted(starts, reverse=True):  # rollback is a length: each start below the last
                prims.truncate(0, start)
                best[start] = min(best[start], run(start, rows))
            fill(rows)
        n = context // 16 * 16 - 16  # the blocks of a whole lane, saved into a pool and loaded back
        pool = prims.open_block_pool(n * prims.capabilities.state_bytes_per_token, 16)
        blocks = [pool.take() for _ in range(0, n, 16)]
        t0 = time.perf_counter()
        for at, index in zip(range(0, n, 16), blocks):
            prims.save_block(0, at, index)
        best["save_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for at, index in zip(range(0, n, 16), blocks):  # again, into slots already written: no page faults
            prims.save_block(0, at, index)
        best["save_again_s"] = time.perf_counter() - t0
        prims.release(0)
        t0 = time.perf_counter()
        prims.load_prefix(0, blocks)
        best["load_s"] = time.perf_counter() - t0
        best["blocks"] = len(blocks)
    return best


def per_turn(result: dict, kind: str, key: str) -> list[float]:
    """The median of ``key`` at each turn over the conversations of ``kind`` (NaN at a turn not run)."""
    rows = [r for k, r in zip(result["kinds"], result["turns"]) if k == kind]
    return [statistics.median(r[i][key] for r in rows) if rows[0][i] is not None else float("nan") for i in range(len(rows[0]))]


def turn_list(text: str) -> set[int]:
    try:
        return {int(k) for k in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected turn numbers separated by commas, like 1,8 (got {text!r})") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=4096, help="about how long the conversation is at its last turn (tokens)")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8, help="conversations at once in the loaded run (and the server's lanes)")
    ap.add_argument("--max-tokens", type=int, default=32, help="reply tokens per turn")
    ap.add_argument("--prefix-cache-mb", type=int, default=1024, help="the cache's budget in the run with it on")
    ap.add_argument("--speculate", default="prompt-lookup")
    ap.add_argument("--serve-flag", action="append", default=[], help="an extra flag for `sf-trt serve` (repeatable)")
    ap.add_argument("--alone-only", action="store_true", help="skip the concurrent run")
    ap.add_argument("--probe-only", action="store_true", help="only the --probe timing")
    ap.add_argument("--probe", action="store_true", help="also time 200 new rows after 0, half and nearly all of --context (the decoder alone, fastest of 3)")
    ap.add_argument("--json", type=Path, default=None)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, default=None, help="serve this model directory (`sf-trt export`'s) instead of the default model")
    src.add_argument("--gguf", type=Path, default=None, help="serve this GGUF (exported by the first server on first use)")
    ap.add_argument("--token-prompts", action="store_true",
                    help="drive the servers with token ids (/v1/completions), one conversation of random ids: for random-weight models")
    ap.add_argument("--off-turns", type=turn_list, default=None, metavar="1,8",
                    help="the turns the server without the cache runs (default: all)")
    args = ap.parse_args(argv)
    if args.off_turns and not all(1 <= k <= args.turns for k in args.off_turns):
        ap.error(f"--off-turns {sorted(args.off_turns)}: turns are 1..{args.turns}")
    cfg = None if args.probe_only else model_config(args)
    if cfg is not None:
        args.token_ids = range(min(3, cfg.vocab - 1) + 1, cfg.vocab)  # past <unk>, <s>, </s> in the synthetic vocabulary
    if args.probe_only:
        probe = new_rows_cost(args.context)
        for start in [k for k in probe if isinstance(k, int)]:
            print(f"200 new rows after {start}: {probe[start]:.3f} s")
        print(f"{probe['blocks']} blocks of 16 positions: saved into fresh pool slots in {probe['save_s']:.3f} s, "
              f"into the same slots again in {probe['save_again_s']:.3f} s, loaded in {probe['load_s']:.3f} s")
        return 0
    load = [os.getloadavg()[0]]
    runs = run(args)
    load.append(os.getloadavg()[0])

    per_turn_size = f"tokens per turn {args.turn_tokens}" if args.token_prompts else f"words per turn {args.turn_words}"
    print(f"load average {load[0]:.2f} before, {load[1]:.2f} after; answers identical with the cache on and off; {per_turn_size}")
    print(f"model: {cfg.n_layers} layers, hidden {cfg.hidden}, {cfg.n_heads} heads ({cfg.n_kv_heads} kv), ffn {cfg.ffn}, vocab {cfg.vocab}")
    summary = {}
    for phase in ("alone",) if args.alone_only else ("alone", "concurrent"):
        for kind in ("tokens",) if args.token_prompts else ("chat", "agent"):
            prompt = per_turn(runs["on"][phase], kind, "prompt_tokens")
            cached = per_turn(runs["on"][phase], kind, "cached_tokens")
            ttft_on = per_turn(runs["on"][phase], kind, "ttft_s")
            ttft_off = per_turn(runs["off"][phase], kind, "ttft_s")
            flops_on, flops_off = predicted_cost(cfg, prompt, cached), predicted_cost(cfg, prompt, [0] * len(prompt))
            summary[f"{phase}/{kind}"] = {
                "prompt_tokens": prompt, "cached_tokens": cached, "ttft_on_s": ttft_on, "ttft_off_s": ttft_off,
                "last_over_first_on": ttft_on[-1] / ttft_on[0], "last_over_first_off": ttft_off[-1] / ttft_off[0],
                "predicted_flops_on": flops_on, "predicted_flops_off": flops_off,
                "predicted_last_over_first_on": flops_on[-1] / flops_on[0], "predicted_last_over_first_off": flops_off[-1] / flops_off[0],
            }
            print(f"\n{phase}, {kind} (median over {sum(1 for k in runs['on'][phase]['kinds'] if k == kind)} conversations)")
            print("| turn | prompt tokens | cached | TTFT on (s) | TTFT off (s) | off / on | prefill GFLOP on | off |\n|---|---|---|---|---|---|---|---|")
            for i in range(args.turns):
                off = "-" if math.isnan(ttft_off[i]) else f"{ttft_off[i]:.2f} | {ttft_off[i] / ttft_on[i]:.2f}"
                print(f"| {i + 1} | {prompt[i]:.0f} | {cached[i]:.0f} | {ttft_on[i]:.2f} | {off if off != '-' else '- | -'} "
                      f"| {flops_on[i] / 1e9:.4g} | {flops_off[i] / 1e9:.4g} |")
            print(f"last turn / first turn: {ttft_on[-1] / ttft_on[0]:.2f} on, {ttft_off[-1] / ttft_off[0]:.2f} off; "
                  f"the arithmetic predicts {flops_on[-1] / flops_on[0]:.2f} on, {flops_off[-1] / flops_off[0]:.2f} off "
                  "(every FLOP alike; bench_fusions.py --ops: the rates of the attention's and the weights' here)")
    print("\n| cache | mixed load: output tok/s | its wall time (s) | peak RSS (MiB) |\n|---|---|---|---|")
    for name, r in runs.items():
        loaded = r["concurrent"] or {"output_tok_s": float("nan"), "wall_s": float("nan")}
        print(f"| {name} ({r['prefix_cache_mb']} MiB) | {loaded['output_tok_s']:.2f} | {loaded['wall_s']:.1f} | {r['peak_rss_mb']:.0f} |")
    if args.probe:
        probe = new_rows_cost(args.context)
        runs["probe"] = {str(k): v for k, v in probe.items()}
        print("\n| 200 new rows after | fastest of 3 (s) | / after 0 |\n|---|---|---|")
        for start in [k for k in probe if isinstance(k, int)]:
            print(f"| {start} | {probe[start]:.3f} | {probe[start] / probe[0]:.2f} |")
    if args.json:
        settings = {k: str(v) if isinstance(v, (Path, range)) else sorted(v) if isinstance(v, set) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"settings": settings,
                                         "load": load, "summary": summary, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
