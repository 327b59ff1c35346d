#!/usr/bin/env python3
"""Peer benchmark: HF transformers, llama.cpp and onnxruntime-genai greedy decoding, plain and with prompt lookup.

Runs SmolLM2-135M-Instruct (the same Q4_1 GGUF sf_trt uses) on the CPU over the
bench prompts (``tools/prompts/bench.jsonl``), with each peer of ``--peers``:

* ``hf``: HF transformers, the GGUF dequantized to fp32 (torch);
* ``llama.cpp``: llama.cpp through llama-cpp-python, the GGUF as shipped (Q4_1
  weights, Q8_0 embedding; its KV cache f16 by default), ``n_threads`` and
  ``n_threads_batch`` both ``--threads``;
* ``genai``: onnxruntime-genai on the model its builder made (``--genai-model DIR``),
  ``intra_op_num_threads`` ``--threads``; its "prompt lookup" is its own n-gram
  speculation (``ngram_size`` 3, ``max_draft_tokens`` ``--lookup-tokens``). Its builder
  reads only float16/float32 GGUFs (and then wants the HF config by hub name), so
  the GGUF goes through transformers' dequantization to an HF checkpoint first:
  the same weights HF runs. Built once (docs/benchmarks.md has the commands)::

      genai-venv/bin/python tools/bench_peers.py --export-hf HF_DIR
      genai-venv/bin/python -m onnxruntime_genai.models.builder -i HF_DIR -o GENAI_DIR -p int4 -e cpu

  Its threads always spin between ops (its session options have no setting for it).

each prompt twice after a warmup:

* plain greedy decoding, ``max_tokens`` new tokens;
* greedy decoding with prompt lookup (HF: ``prompt_lookup_num_tokens``;
  llama.cpp: ``LlamaPromptLookupDecoding(num_pred_tokens)``; both ``--lookup-tokens``, 10).

EOS does not end a run early (HF: ``min_new_tokens = max_new_tokens``;
llama.cpp: its token generator is read for exactly ``max_tokens`` tokens) unless
``--allow-eos``. It reports tokens/s (new tokens over the whole call, prefill
included) and whether each peer's prompt-lookup output equals its own plain
output token for token (and the first index where it does not), prints a
table and writes JSON (``--json``, default ``bench_peers.json``).

For fairness the prompt token ids are sf_trt's own (``sf_trt.tokenizer`` built
from the same GGUF, same chat template) whenever sf_trt is importable; HF's
chat-template ids are computed too and the JSON records both counts and whether
they agree.

``--sf-trt`` also runs ``sf-trt bench --prompts FILE --json`` in the same run,
one prompt at a time right after the peers ran that prompt (so a change in the
machine's load hits sf_trt and the peers alike), and adds ratio columns (sf_trt
plain / each peer's plain, sf_trt spec / each peer's prompt lookup);
``--sf-trt-json PATH`` merges a saved ``sf-trt bench --json`` output instead.
Threads wait alike on both sides: llama.cpp's OpenMP threads spin between ops unless
``OMP_WAIT_POLICY=PASSIVE``, so sf-trt runs with ``--spin`` unless that is set (its own
default is to sleep); the table's heading and the JSON say which.

``--prefill 256,1024,4096`` measures prefill instead of decoding: one prompt of each
length (the bench prompts' sf_trt ids, concatenated and repeated, cut to the length:
the same ids for every engine), its time to the first token, twice, the faster
counting: llama.cpp's ``generate`` read for one token (its prefill in batches of
``n_batch`` 512, then the token), HF's ``generate(max_new_tokens=1)``, and with
``--sf-trt`` ``sf-trt bench`` on the ids with ``max_tokens`` 1 right after the
peers' runs (its plain and speculative runs are the two, each's ``first_token_s``: from
the request's admission, so process start and session creation are outside, to the
first token; the prefill is sf_trt's own: the Generator's chunks of 256 rows,
``DEFAULT_PREFILL_CHUNK``).
Prompt tokens over that time is the prefill rate; the table and the JSON's
``"prefill"`` have each engine's and sf_trt's ratio to each peer.

The limit: after the decoding runs, a STREAM-like triad in numpy (``--bandwidth-mib``
MiB arrays, on 1 and on ``--threads`` threads, the faster counting) gives this
machine's bytes/s, and each engine's weight bytes read per decode pass come from its
own files (the GGUF's tensors for llama.cpp, the ONNX initializers for genai and
sf_trt (``--sf-trt-model``, default the GGUF's int8 export in the cache) less the
tables a pass only gathers a row from, fp32 parameters for HF). Each engine's plain
decode (decode only where its first token's time is known: llama.cpp, genai; sf_trt's own
decode-only rate from ``sf-trt bench``)
is printed as a fraction of bandwidth / bytes per token, and the JSON has ``"limit"``.

The peers are not sf_trt dependencies: install them in a separate environment,
e.g.::

    python3 -m venv peers-venv
    peers-venv/bin/pip install torch==2.13.0    # the CPU build
    peers-venv/bin/pip install transformers accelerate gguf numpy
    peers-venv/bin/pip install llama-cpp-python  # builds llama.cpp from source (~30 min on 2 cores)
    peers-venv/bin/python tools/bench_peers.py --threads 2

A peer whose packages are missing is left out with a note (``--peers`` names the
ones to run); none left is exit 2.

Exit status: 0 done, 2 a missing prerequisite (no peer importable, or the GGUF
file), 1 any other failure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROMPTS = Path(__file__).resolve().parent / "prompts" / "bench.jsonl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def say(msg: str) -> None:
    print(f"bench_peers: {msg}", file=sys.stderr, flush=True)


class Missing(Exception):
    """A prerequisite is missing (exit 2)."""


# -- peers -------------------------------------------------------------------


PEERS = ("hf", "llama.cpp", "genai")


class HFPeer:
    """HF transformers on torch: the GGUF dequantized to fp32, ``generate()`` with or without
    ``prompt_lookup_num_tokens``."""

    name = "hf"
    packages = ("torch", "transformers", "accelerate", "gguf")

    def __init__(self, gguf: Path, threads: int) -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch = torch
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        self.tokenizer, self.model, self.eos = _load_hf(torch, transformers, gguf)

    def describe(self) -> str:
        return f"HF transformers {self.versions['transformers']} / torch {self.versions['torch']}, fp32"

    def generate(self, ids: list[int], n: int, *, allow_eos: bool, lookup: int | None) -> tuple[list[int], float]:
        return generate(self.torch, self.model, ids, n, allow_eos=allow_eos, eos=self.eos, lookup=lookup)


class LlamaCppPeer:
    """llama.cpp through llama-cpp-python: the GGUF as shipped, greedy (``temp=0``), plain or
    with ``LlamaPromptLookupDecoding``; each run starts from an empty KV cache."""

    name = "llama.cpp"
    packages = ("llama_cpp",)

    def __init__(self, gguf: Path, threads: int, n_ctx: int, lookup: int) -> None:
        preload_llama_cpp_shim()
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.versions = {"llama_cpp_python": llama_cpp.__version__}
        kw = dict(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx, n_batch=512, seed=0, verbose=False)
        self.plain = Llama(**kw)
        self.lookup = Llama(**kw, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=lookup))
        self.eos = int(self.plain.token_eos())
        self.last_first_token_s: float | None = None

    def describe(self) -> str:
        return f"llama.cpp (llama-cpp-python {self.versions['llama_cpp_python']}), the GGUF as shipped"

    def generate(self, ids: list[int], n: int, *, allow_eos: bool, lookup: int | None) -> tuple[list[int], float]:
        llm = self.lookup if lookup else self.plain
        llm.reset()  # no KV-cache reuse from the previous run of the same prompt
        out: list[int] = []
        start = time.perf_counter()
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if len(out) == 1:
                self.last_first_token_s = time.perf_counter() - start
            if len(out) >= n or (allow_eos and tok == self.eos):
                break
        return out, time.perf_counter() - start


def preload_llama_cpp_shim() -> None:
    """Where ``LLAMA_CPP_LIB_PATH`` names a prebuilt llama.cpp patched by tools/llama_cpp_glibc.py
    (the llama-cpp-py-sync wheel's libraries on an older glibc), open its shim first. Unset, and
    llama-cpp-python installed without its own library (``-DLLAMA_BUILD=OFF``) beside
    llama-cpp-py-sync, it is set to that package's folder."""
    import importlib.util

    lib = os.environ.get("LLAMA_CPP_LIB_PATH")
    own, prebuilt = importlib.util.find_spec("llama_cpp"), importlib.util.find_spec("llama_cpp_py_sync")
    if not lib and own and own.origin and prebuilt and prebuilt.origin and not list((Path(own.origin).parent / "lib").glob("libllama*")):
        lib = os.environ["LLAMA_CPP_LIB_PATH"] = str(Path(prebuilt.origin).parent)
        say(f"llama-cpp-python has no library of its own: LLAMA_CPP_LIB_PATH={lib} (llama-cpp-py-sync's)")
    if lib:
        if str(Path(__file__).resolve().parent) not in sys.path:  # tools/ is no package
            sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llama_cpp_glibc import preload

        preload(Path(lib))


GENAI_NGRAM_SIZE = 3
"""The n-gram length onnxruntime-genai's own n-gram speculation matches on (``speculative.ngram_size``)."""


class GenAIPeer:
    """onnxruntime-genai on its builder's model (``--genai-model DIR``, built once from the same
    GGUF: see the module docstring), greedy, plain or with its n-gram speculation
    (``ngram_size`` :data:`GENAI_NGRAM_SIZE`, ``max_draft_tokens`` ``--lookup-tokens``); each run a
    new ``og.Generator`` whose KV buffer is sized to the request (``max_length``). Its threads
    always spin between ops: genai_config.json's session options have no setting for it."""

    name = "genai"
    packages = ("onnxruntime_genai",)

    def __init__(self, model_dir: Path, threads: int) -> None:
        import onnxruntime_genai as og

        if not (model_dir / "genai_config.json").is_file():
            raise Missing(f"--genai-model {model_dir}: no genai_config.json (build it with onnxruntime-genai's builder; "
                          "tools/bench_peers.py's docstring has the commands)")
        config = og.Config(str(model_dir))
        config.clear_providers()  # the CPU
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        self.og, self.model, self.model_dir = og, og.Model(config), model_dir
        self.versions = {"onnxruntime_genai": og.__version__}
        self.last_first_token_s: float | None = None

    def describe(self) -> str:
        return f"onnxruntime-genai {self.versions['onnxruntime_genai']} ({self.model_dir.name}), threads spinning"

    def generate(self, ids: list[int], n: int, *, allow_eos: bool, lookup: int | None) -> tuple[list[int], float]:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + n, min_length=len(ids) + (0 if allow_eos else n), do_sample=False)
        if lookup:
            params.set_speculative_options(ngram_size=GENAI_NGRAM_SIZE, max_draft_tokens=lookup)
        self.last_first_token_s = None
        start = time.perf_counter()
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
            if self.last_first_token_s is None:
                self.last_first_token_s = time.perf_counter() - start
        seconds = time.perf_counter() - start
        return [int(t) for t in gen.get_sequence(0)[len(ids):]][:n], seconds


def missing_packages(peer) -> list[str]:
    """The packages of ``peer`` this interpreter cannot import."""
    import importlib.util

    return [name for name in peer.packages if importlib.util.find_spec(name) is None]


INSTALL_HINT = (
    "The peers are not sf_trt dependencies; install them in a separate environment, e.g.\n"
    "    python3 -m venv peers-venv\n"
    "    peers-venv/bin/pip install torch==2.13.0 transformers accelerate gguf numpy   # hf\n"
    "    peers-venv/bin/pip install llama-cpp-python                                   # llama.cpp (builds from source)\n"
    "    peers-venv/bin/pip install onnxruntime-genai onnx_ir accelerate               # genai (and --genai-model DIR)\n"
    "and run this with that interpreter: peers-venv/bin/python tools/bench_peers.py ..."
)


def cache_root() -> Path:
    env = os.environ.get("SF_TRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sf_trt"


def find_gguf(explicit: str | None) -> Path:
    """``--gguf``, else ``$SF_TRT_GGUF``, else the extracted GGUF anywhere under the sf_trt cache."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise Missing(f"--gguf {path}: no such file")
        return path
    env = os.environ.get("SF_TRT_GGUF")
    if env and Path(env).expanduser().is_file():
        return Path(env).expanduser()
    root = cache_root()
    found = sorted(root.rglob(GGUF_NAME)) if root.is_dir() else []
    found = [p for p in found if p.is_file()]
    if not found:
        raise Missing(
            f"no {GGUF_NAME} under {root} (the sf_trt cache: $SF_TRT_CACHE or ~/.cache/sf_trt). "
            "Run `sf-trt export` first (it fetches and extracts the model), or pass --gguf PATH."
        )
    found.sort(key=lambda p: (p.parent.name != "gguf", len(p.parts)))  # prefer cache/gguf/
    return found[0]


def load_prompts(path: Path, only: list[str] | None, max_tokens: int | None) -> list[dict[str, Any]]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                p = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{n}: not JSON ({exc})")
            for key in ("id", "messages", "max_tokens"):
                if key not in p:
                    raise SystemExit(f"{path}:{n}: missing {key!r}")
            if max_tokens is not None:
                p["max_tokens"] = max_tokens
            prompts.append(p)
    if only:
        unknown = set(only) - {p["id"] for p in prompts}
        if unknown:
            raise SystemExit(f"--only: no prompt(s) {sorted(unknown)} in {path}")
        prompts = [p for p in prompts if p["id"] in only]
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return prompts


# -- tokenization --------------------------------------------------------------


def hf_prompt_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # BatchEncoding (transformers >= 5)
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]


def sf_trt_tokenizer(gguf: Path):
    """sf_trt's own tokenizer for ``gguf``, or (None, why): sf_trt must be installed in this
    interpreter (the peers' environment: ``pip install --no-deps -e .`` from the checkout)."""
    try:
        from sf_trt.export.gguf_llama import open_reader, read_tokenizer

        return read_tokenizer(open_reader(gguf)), None
    except Exception as exc:  # noqa: BLE001 - any failure: fall back to HF's ids
        return None, f"{type(exc).__name__}: {exc}"


# -- generation ----------------------------------------------------------------


def generate(torch, model, ids: list[int], n: int, *, allow_eos: bool, eos: int, lookup: int | None) -> tuple[list[int], float]:
    inputs = torch.tensor([ids], dtype=torch.long)
    kwargs: dict[str, Any] = dict(
        input_ids=inputs,
        attention_mask=torch.ones_like(inputs),
        max_new_tokens=n,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=eos,
    )
    if not allow_eos:
        kwargs["min_new_tokens"] = n
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(**kwargs)
        seconds = time.perf_counter() - start
    return [int(t) for t in out[0, len(ids):].tolist()], seconds


def decode_rate(tokens: int, seconds: float, first_token_s: float | None) -> float | None:
    """Tokens after the first over the seconds after it: the decode alone, without the prefill."""
    if first_token_s is None or tokens < 2 or seconds <= first_token_s:
        return None
    return (tokens - 1) / (seconds - first_token_s)


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# -- sf_trt --------------------------------------------------------------------


def parse_json_output(text: str) -> dict | None:
    """The last JSON object with "results" in ``text`` (the whole text, or a line-started object)."""
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and "results" in doc:
            return doc
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    best = None
    pos = 0
    while (pos := text.find("{", pos)) != -1:
        if pos == 0 or text[pos - 1] == "\n":
            try:
                doc, _ = decoder.raw_decode(text, pos)
                if isinstance(doc, dict) and "results" in doc:
                    best = doc
            except json.JSONDecodeError:
                pass
        pos += 1
    return best


def sf_trt_spins() -> bool:
    """Whether sf-trt's threads spin in this run: as llama.cpp's OpenMP threads do, so unless
    ``OMP_WAIT_POLICY=PASSIVE`` (sf-trt's own default is to sleep; it spins with ``--spin``)."""
    return os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"


def run_sf_trt(cmd: list[str], prompts: list[dict], threads: int, allow_eos: bool, timeout: float,
               extra: list[str] | tuple[str, ...] = (), repeats: int = 1) -> tuple[dict | None, str]:
    """Run ``sf-trt bench --prompts FILE --json`` on exactly ``prompts``, with ``extra`` (``--sf-trt-args``:
    e.g. ``--model DIR``) after ``bench`` and ``--repeats`` where more than one (the fastest of them
    counts, as for the peers); (its JSON or None, a note)."""
    try:
        helptext = subprocess.run(cmd + ["bench", "--help"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run {shlex.join(cmd)} ({exc})"
    if helptext.returncode != 0:
        tail = (helptext.stderr or helptext.stdout).strip().splitlines()[-3:]
        return None, f"`{shlex.join(cmd)} bench --help` failed (exit {helptext.returncode}): {' | '.join(tail)}"
    options = helptext.stdout + helptext.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", prefix="bench_peers_", delete=False, encoding="utf-8") as f:
        for p in prompts:  # the effective set (--only, --max-tokens applied)
            f.write(json.dumps({k: p[k] for k in p if k in ("id", "kind", "messages", "prompt_ids", "max_tokens")}) + "\n")
        prompt_file = f.name
    full = cmd + ["bench", *extra, "--prompts", prompt_file, "--json"]
    if "--threads" in options:
        full += ["--threads", str(threads)]
    if not allow_eos and "--ignore-eos" in options:  # exactly max_tokens tokens, as the HF runs
        full += ["--ignore-eos"]
    if repeats > 1:
        if "--repeats" not in options:
            return None, f"`{shlex.join(cmd)} bench` has no --repeats (an older sf-trt): run with --repeats 1"
        full += ["--repeats", str(repeats)]
    if sf_trt_spins() and "--spin" in options:  # the threads wait as llama.cpp's OpenMP threads do
        full += ["--spin"]
    say(f"running {shlex.join(full)}")
    try:
        done = subprocess.run(full, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"{shlex.join(full)} ran past {timeout:.0f} s"
    except OSError as exc:
        return None, f"could not run {shlex.join(full)} ({exc})"
    finally:
        os.unlink(prompt_file)
    doc = parse_json_output(done.stdout)
    if doc is None:  # (exit 1 with a report only says some speculative output differed)
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return None, f"{shlex.join(full)} (exit {done.returncode}): no JSON object with \"results\" in its output: " + " | ".join(tail)
    return doc, shlex.join(full) + (f" (exit {done.returncode})" if done.returncode else "")


def merge_sf_trt(results: list[dict], doc: dict) -> int:
    """Add sf_trt's numbers and ratios to each peer's (by id) in ``results``; how many matched."""
    by_id = {str(r.get("id")): r for r in doc.get("results", []) if isinstance(r, dict)}
    matched = 0
    for res in results:
        sf = by_id.get(res["id"])
        if sf is None:
            continue
        matched += 1
        plain = sf.get("plain") or {}
        spec = sf.get("spec") or {}
        entry: dict[str, Any] = {
            "identical": sf.get("identical"),
            "plain_tokens_per_s": plain.get("tokens_per_s"),
            "spec_tokens_per_s": spec.get("tokens_per_s"),
            "plain_tokens": plain.get("tokens"),
            "spec_tokens": spec.get("tokens"),
            "proposed": spec.get("proposed"),
            "accepted": spec.get("accepted"),
            "prompt_tokens": sf.get("prompt_tokens"),
            "prompt_tokens_match": sf.get("prompt_tokens") == res["prompt_tokens"] if sf.get("prompt_tokens") is not None else None,
        }
        sp, ss = entry["plain_tokens_per_s"], entry["spec_tokens_per_s"]
        for name, peer in res["peers"].items():
            hp, hl = peer["plain"]["tokens_per_s"], peer["lookup"]["tokens_per_s"]
            entry[f"ratio_plain_{name}"] = sp / hp if isinstance(sp, (int, float)) and hp else None
            entry[f"ratio_spec_{name}"] = ss / hl if isinstance(ss, (int, float)) and hl else None
        res["sf_trt"] = entry
    return matched


# -- the limit: this machine's memory bandwidth, the bytes a decode pass reads --


TRIAD_ARRAYS_MOVED = 5
"""Arrays of traffic per element of the numpy triad: ``a = s * c`` reads c and writes a, ``a += b`` reads a and b
and writes a (numpy has no fused triad; write-allocate reads are not counted, as STREAM does not)."""


def triad_bandwidth(threads: int, mib: int, repeats: int = 5) -> dict[str, Any]:
    """A STREAM-like triad, ``a = b + s * c`` over float64 arrays of ``mib`` MiB (far past the caches), in
    ``threads`` threads at once (numpy's loops release the GIL), each on its own arrays; the fastest of
    ``repeats`` rounds: bytes moved per second over all threads."""
    import threading

    import numpy as np

    n = mib * (1 << 20) // 8
    arrays = [(np.zeros(n), np.full(n, 1.0), np.full(n, 2.0)) for _ in range(threads)]
    gate = threading.Barrier(threads + 1)

    def triad(a, b, c) -> None:
        gate.wait()
        np.multiply(c, 3.0, out=a)
        np.add(a, b, out=a)
        gate.wait()

    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=triad, args=arrs) for arrs in arrays]
        for w in workers:
            w.start()
        gate.wait()
        start = time.perf_counter()
        gate.wait()
        best = min(best, time.perf_counter() - start)
        for w in workers:
            w.join()
    moved = TRIAD_ARRAYS_MOVED * 8 * n * threads
    return {"bytes_per_s": moved / best, "threads": threads, "mib_per_array": mib, "seconds": best, "bytes_moved": moved,
            "kernel": f"numpy a = c * 3; a += b, float64, {TRIAD_ARRAYS_MOVED} arrays of traffic per element"}


def machine_bandwidth(threads: int, mib: int) -> dict[str, Any]:
    """The triad on 1 and on ``threads`` threads; the faster is the limit (on shared cores a thread that
    waits for its core makes the many-thread figure the lower one)."""
    runs = [triad_bandwidth(t, mib) for t in sorted({1, threads})]
    best = max(runs, key=lambda r: r["bytes_per_s"])
    return {"bytes_per_s": best["bytes_per_s"], "threads": best["threads"], "mib_per_array": mib, "runs": runs}


def onnx_bytes_per_token(model: Path) -> dict[str, Any]:
    """The initializer bytes one decode pass of the ONNX graph ``model`` reads: every initializer but the
    tables only gathered from (an embedding, its block scales, rotary tables: a pass reads a row of
    each), directly or through a Reshape."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(model), load_external_data=False).graph
    gathers = ("Gather", "GatherBlockQuantized")
    reshaped = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Reshape"}  # a table reshaped, then gathered
    gathered = {reshaped.get(n.input[0], n.input[0]) for n in graph.node if n.op_type in gathers}
    gathered_via = {n.input[0] for n in graph.node if n.op_type in gathers}
    used_otherwise = {
        i for n in graph.node for k, i in enumerate(n.input)
        if not (k == 0 and n.op_type in gathers) and not (k == 0 and n.op_type == "Reshape" and n.output[0] in gathered_via)
    }
    read = tables = 0
    for init in graph.initializer:
        length = {e.key: e.value for e in init.external_data}.get("length")
        if length is not None:
            size = int(length)
        elif init.raw_data:
            size = len(init.raw_data)
        else:
            count = 1
            for d in init.dims:
                count *= d
            size = count * helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        if init.name in gathered and init.name not in used_otherwise:
            tables += size
        else:
            read += size
    return {"bytes_per_token": read, "gathered_tables_bytes": tables, "file": str(model)}


def gguf_bytes_per_token(gguf: Path) -> dict[str, Any]:
    """The tensor bytes one decode pass of the GGUF reads: all but the token embedding, which counts
    only where it is also the output matrix (tied, as in SmolLM2)."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    tied = "output.weight" not in sizes
    return {"bytes_per_token": sum(v for k, v in sizes.items() if k != "token_embd.weight" or tied), "tied_embedding": tied, "file": str(gguf)}


def bytes_per_token(peers, gguf: Path, sf_model: Path | None) -> dict[str, dict]:
    """Each engine's weight bytes read per decode pass, from its own model files (a note where they cannot be read)."""
    found: dict[str, dict] = {}
    sources = {peer.name: peer for peer in peers}
    if sf_model is not None:
        sources["sf_trt"] = sf_model
    for name, source in sources.items():
        try:
            if name == "llama.cpp":
                found[name] = gguf_bytes_per_token(gguf)
            elif name == "genai":
                found[name] = onnx_bytes_per_token(source.model_dir / "model.onnx")
            elif name == "hf":  # fp32, tied parameters once
                found[name] = {"bytes_per_token": sum(t.numel() * t.element_size() for t in source.model.parameters()), "file": "fp32 parameters"}
            else:
                found[name] = onnx_bytes_per_token(source / "decoder_pass.onnx")
        except Exception as exc:  # noqa: BLE001 - a missing reader (onnx, gguf) leaves that engine's fraction out
            found[name] = {"bytes_per_token": None, "note": f"{type(exc).__name__}: {exc}"}
    return found


def limit_report(results: list[dict], sf_doc: dict | None, weights: dict[str, dict], bandwidth: dict) -> dict[str, dict]:
    """Per engine: its plain decode rate over all prompts (decode-only where its first-token time is known, else
    end to end), the bytes it reads per token, and that rate as a fraction of bandwidth / bytes per token."""
    rates: dict[str, tuple[float | None, str]] = {}
    for name in (results[0]["peers"] if results else {}):
        runs = [r["peers"][name]["plain"] for r in results]
        rates[name] = _overall_rate(runs)
    if sf_doc is not None:
        rates["sf_trt"] = sf_trt_decode_rate(sf_doc)
    out = {}
    for name, (rate, how) in rates.items():
        per_token = (weights.get(name) or {}).get("bytes_per_token")
        limit = bandwidth["bytes_per_s"] / per_token if per_token else None
        out[name] = {"tokens_per_s": rate, "rate": how, "bytes_per_token": per_token, "limit_tokens_per_s": limit,
                     "fraction_of_limit": rate / limit if rate and limit else None}
    return out


def sf_trt_decode_rate(doc: dict) -> tuple[float | None, str]:
    """sf_trt's plain decode rate: ``sf-trt bench``'s own decode-only rate (its runs less the time the
    same prompts take to one token, timed apart), where given. Not from each request's ``first_token_s``:
    that is the end of the tick that carried the first token (``--tick-tokens``, 16 by default), so
    tokens after the first over the time after it would overstate the rate."""
    decode = (doc.get("decode_tokens_per_s") or {}).get("plain")
    if isinstance(decode, (int, float)) and 0 < decode < 1e6:  # (bench clamps a non-positive time to 1e-9 s)
        return float(decode), "decode only (sf-trt bench's: less its own 1-token runs of the same prompts)"
    return _overall_rate([{k: v for k, v in r["plain"].items() if k != "first_token_s"} for r in doc.get("results", [])])


def _overall_rate(runs: list[dict]) -> tuple[float | None, str]:
    """Tokens over seconds summed over ``runs``: after the first token where every run says when it came."""
    if runs and all(isinstance(r.get("first_token_s"), (int, float)) and r.get("tokens_per_s") for r in runs):
        after_first = sum(r["tokens"] / r["tokens_per_s"] - r["first_token_s"] for r in runs)
        if after_first > 0:  # (a few tokens at a rounded rate can put the first token's time past the whole run's)
            return sum(r["tokens"] - 1 for r in runs) / after_first, "decode only"
    if runs and all(r.get("tokens_per_s") for r in runs):
        return sum(r["tokens"] for r in runs) / sum(r["tokens"] / r["tokens_per_s"] for r in runs), "end to end (prefill included)"
    return None, "no runs"


def print_limit(limit: dict[str, dict], bandwidth: dict) -> None:
    print(f"\nmemory bandwidth (triad, {bandwidth['threads']} threads, {bandwidth['mib_per_array']} MiB arrays): "
          f"{bandwidth['bytes_per_s'] / 1e9:.1f} GB/s")
    for name, row in limit.items():
        per = row["bytes_per_token"]
        print(f"  {name}: {fmt(row['tokens_per_s'])} tok/s plain ({row['rate']}); "
              f"{fmt(per / 1e6 if per else None)} MB read per token -> limit {fmt(row['limit_tokens_per_s'])} tok/s; "
              f"{fmt(100 * row['fraction_of_limit'] if row['fraction_of_limit'] else None)}% of it")


# -- prefill -------------------------------------------------------------------

PREFILL_RUNS = 2
"""Timed runs of each prompt length per engine; the faster counts (sf_trt: its bench's plain and speculative run)."""


def prefill_ids(encoded: list[tuple], length: int) -> list[int]:
    """``length`` prompt ids: the bench prompts' ids one after another, repeated, cut to ``length``."""
    pool = [t for _, ids, _, _ in encoded for t in ids]
    return (pool * -(-length // len(pool)))[:length]


def sf_trt_prefill(cmd: list[str], ids: list[int], args) -> tuple[list[float] | None, str]:
    """sf_trt's times to the first token of ``ids`` (``sf-trt bench``, ``max_tokens`` 1: its plain
    and its speculative run), or (None, why)."""
    doc, note = run_sf_trt(cmd, [{"id": f"prefill_{len(ids)}", "prompt_ids": ids, "max_tokens": 1}], args.threads, True, args.sf_trt_timeout,
                           shlex.split(args.sf_trt_args))
    result = next(iter((doc or {}).get("results") or []), None)
    if result is None:
        return None, note
    times = [result[run].get("first_token_s") for run in ("plain", "spec")]
    if result.get("prompt_tokens") != len(ids) or not all(isinstance(t, (int, float)) and t > 0 for t in times):
        return None, f"{note}: expected {len(ids)} prompt tokens and each run's first_token_s, got {json.dumps(result)[:300]}"
    return times, note


def measure_prefill(peers, encoded, args, sf_cmd: list[str] | None) -> list[dict[str, Any]]:
    """Each length of ``--prefill``: every peer's time to the first token, then sf_trt's."""
    rows = []
    for length in args.prefill:
        ids = prefill_ids(encoded, length)
        row: dict[str, Any] = {"prompt_tokens": length, "peers": {}}
        for peer in peers:
            times = [peer.generate(ids, 1, allow_eos=True, lookup=None)[1] for _ in range(PREFILL_RUNS)]
            row["peers"][peer.name] = {"seconds": times, "best_s": min(times), "tokens_per_s": length / min(times)}
            say(f"prefill {length}: {peer.name} {min(times):.3f} s ({length / min(times):.0f} tok/s)")
        if sf_cmd is not None:
            times, note = sf_trt_prefill(sf_cmd, ids, args)
            if times is None:
                row["sf_trt"] = {"note": note}
                say(f"prefill {length}: sf_trt left out: {note}")
            else:
                sf = row["sf_trt"] = {"seconds": times, "best_s": min(times), "tokens_per_s": length / min(times), "command": note}
                for name, peer in row["peers"].items():
                    sf[f"ratio_{name}"] = sf["tokens_per_s"] / peer["tokens_per_s"]
                say(f"prefill {length}: sf_trt {min(times):.3f} s ({length / min(times):.0f} tok/s)")
        rows.append(row)
    return rows


def print_prefill_table(rows: list[dict], peers: list[str]) -> None:
    head = ["prompt tokens"]
    for name in peers:
        head += [f"{name} s", f"{name} tok/s"]
    with_sf = any("tokens_per_s" in (r.get("sf_trt") or {}) for r in rows)
    if with_sf:
        head += ["sf_trt s", "sf_trt tok/s"] + [f"sf/{name}" for name in peers]
    table = []
    for r in rows:
        cells = [str(r["prompt_tokens"])]
        for name in peers:
            p = r["peers"][name]
            cells += [fmt(p["best_s"], ".3f"), fmt(p["tokens_per_s"], ".0f")]
        if with_sf:
            sf = r.get("sf_trt") or {}
            cells += [fmt(sf.get("best_s"), ".3f"), fmt(sf.get("tokens_per_s"), ".0f")]
            cells += [fmt(sf.get(f"ratio_{name}"), ".2f") + ("x" if sf.get(f"ratio_{name}") else "") for name in peers]
        table.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in table)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for cells in table:
        print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))


# -- output --------------------------------------------------------------------


def fmt(x: Any, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "NO"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def print_table(results: list[dict], peers: list[str], with_sf: bool) -> None:
    head = ["id", "kind", "prompt", "new"]
    for name in peers:
        head += [f"{name} plain", f"{name} PLD", "PLD==plain"]
    if with_sf:
        head += ["sf plain", "sf spec", "sf ident"]
        for name in peers:
            head += [f"sf/{name} plain", f"sf/{name} PLD"]
    rows = []
    for r in results:
        first = next(iter(r["peers"].values()))
        row = [r["id"], r.get("kind") or "-", r["prompt_tokens"], first["plain"]["tokens"]]
        for name in peers:
            p = r["peers"][name]
            row += [fmt(p["plain"]["tokens_per_s"]), fmt(p["lookup"]["tokens_per_s"]),
                    fmt(p["identical"]) + ("" if p["identical"] else f" @{p['first_diff']}")]
        if with_sf:
            sf = r.get("sf_trt") or {}
            row += [fmt(sf.get("plain_tokens_per_s")), fmt(sf.get("spec_tokens_per_s")), fmt(sf.get("identical"))]
            for name in peers:
                row += [fmt(sf.get(f"ratio_plain_{name}"), ".2f"), fmt(sf.get(f"ratio_spec_{name}"), ".2f")]
        rows.append([str(c) for c in row])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))


# -- main ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help=f"prompt file, JSON lines (default {DEFAULT_PROMPTS.relative_to(REPO)})")
    ap.add_argument("--gguf", help=f"the model GGUF (default: $SF_TRT_GGUF, else {GGUF_NAME} found under $SF_TRT_CACHE or ~/.cache/sf_trt)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peers to run, of {', '.join(PEERS)} (default: all; "
                    "one whose packages are missing here is left out with a note)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads of every run: torch.set_num_threads, llama.cpp's n_threads and n_threads_batch, sf-trt --threads (default: all cores)")
    ap.add_argument("--max-tokens", type=int, help="override every prompt's max_tokens")
    ap.add_argument("--allow-eos", action="store_true", help="let EOS end a run early (default: exactly max_tokens new tokens)")
    ap.add_argument("--lookup-tokens", type=int, default=10, help="draft tokens of each peer's prompt lookup (default 10)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warmup runs of each mode before measuring (default 1)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per prompt and mode, sf-trt's too; the fastest counts (default 1)")
    ap.add_argument("--only", action="append", metavar="ID", help="run only this prompt id (repeatable)")
    ap.add_argument("--prompt-ids", choices=("auto", "sf_trt", "hf"), default="auto",
                    help="whose prompt token ids every peer is fed: sf_trt's tokenizer (auto: when importable) or HF's chat template")
    ap.add_argument("--export-hf", type=Path, metavar="DIR",
                    help="write the GGUF as an HF checkpoint (float32) to DIR, for onnxruntime-genai's builder, and exit")
    ap.add_argument("--genai-model", type=Path, help="the genai peer's model directory (onnxruntime-genai's builder output)")
    ap.add_argument("--sf-trt-model", type=Path,
                    help="sf_trt's model directory, for its bytes per token (default: the GGUF's int8 export under the sf_trt cache)")
    ap.add_argument("--bandwidth-mib", type=int, default=64, help="MiB per array of the bandwidth probe's triad, per thread (default 64)")
    ap.add_argument("--json", dest="json_path", type=Path, default=Path("bench_peers.json"), help="write results here (default bench_peers.json)")
    ap.add_argument("--sf-trt", action="store_true", help="also run `sf-trt bench --json` on each prompt right after the peers, and add ratio columns")
    ap.add_argument("--sf-trt-cmd", default=None, help="the sf-trt command line (default: `sf-trt` on PATH)")
    ap.add_argument("--sf-trt-args", default="", metavar="ARGS",
                    help="more `sf-trt bench` options, one string, after `bench` (e.g. \"--model DIR --weights q4\" for another model than "
                    "the default SmolLM2 export)")
    ap.add_argument("--sf-trt-json", type=Path, help="merge this saved `sf-trt bench --json` output instead of running sf-trt")
    ap.add_argument("--sf-trt-timeout", type=float, default=3600.0, help="seconds to allow each sf-trt run (default 3600)")
    ap.add_argument("--prefill", type=_lengths, metavar="N,N,...",
                    help="measure prefill instead of decoding: time to the first token of a prompt of each length "
                    "(e.g. 256,1024,4096; the same ids for every engine), tokens/s and sf_trt's ratio")
    return ap


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated prompt lengths like 256,1024, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"expected prompt lengths >= 1, got {text!r}")
    return lengths


def _load_hf(torch, transformers, gguf: Path):
    """``(tokenizer, model, eos)`` of the GGUF in HF transformers, float32; Missing if it loads otherwise."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    say(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads; loading {gguf}")
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = "dtype" if major_minor >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **{dtype_kw: torch.float32})
    model.eval()  # transformers dequantizes the GGUF at load (``.float()`` is refused on it): check the result
    dtypes = sorted({str(t.dtype) for t in model.parameters()})
    if dtypes != ["torch.float32"]:
        raise Missing(f"{gguf}: the model loaded with parameter dtypes {dtypes}, expected only torch.float32")
    say(f"loaded in {time.perf_counter() - t0:.1f} s ({type(model).__name__}, {model.dtype})")
    eos = tok.eos_token_id if tok.eos_token_id is not None else model.config.eos_token_id
    return tok, model, eos


def export_hf_checkpoint(gguf: Path, out: Path) -> None:
    """The GGUF as an HF checkpoint directory (float32, transformers' own dequantization; tokenizer and chat
    template beside it): what onnxruntime-genai's builder takes (``-i out``). transformers refuses to save a
    model it loaded from a GGUF, so its weights are moved into a plain model of the same config first."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    tok, model, _ = _load_hf(torch, transformers, gguf)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    say(f"wrote {out} (build the genai model: python -m onnxruntime_genai.models.builder -i {out} -o GENAI_DIR -p int4 -e cpu)")


def _encode(prompts, hf_tok, sf_tok) -> list[tuple]:
    """``(prompt, ids fed, HF's ids or None, sf_trt's ids or None)`` per prompt."""
    encoded = []
    for p in prompts:
        hf_ids = hf_prompt_ids(hf_tok, p["messages"]) if hf_tok is not None else None
        sf_ids = sf_tok.encode(sf_tok.apply_chat_template(p["messages"], add_generation_prompt=True)) if sf_tok else None
        if sf_ids is not None and hf_ids is not None and sf_ids != hf_ids:
            say(f"{p['id']}: HF's prompt ids differ from sf_trt's at index {first_diff(sf_ids, hf_ids)} "
                f"({len(hf_ids)} vs {len(sf_ids)} tokens); feeding sf_trt's")
        encoded.append((p, sf_ids if sf_ids is not None else hf_ids, hf_ids, sf_ids))
    return encoded


def _measure(peers, encoded, modes, args, sf_turn=None) -> list[dict[str, Any]]:
    """Each prompt with each peer in each mode, the fastest of ``args.repeats`` runs; the
    peers take turns prompt by prompt, so a change in the machine's load hits them alike.
    ``sf_turn(prompt)``, when given, runs sf_trt on the prompt right after the peers did."""
    results = []
    for p, ids, hf_ids, sf_ids in encoded:
        res: dict[str, Any] = {
            "id": p["id"], "kind": p.get("kind"), "max_tokens": p["max_tokens"],
            "prompt_tokens": len(ids),
            "prompt_ids_source": "sf_trt" if sf_ids is not None else "hf",
            "prompt_tokens_hf": len(hf_ids) if hf_ids is not None else None,
            "prompt_tokens_sf_trt": len(sf_ids) if sf_ids is not None else None,
            "prompt_ids_match": (sf_ids == hf_ids) if sf_ids is not None and hf_ids is not None else None,
            "peers": {},
        }
        for peer in peers:
            runs: dict[str, Any] = {}
            for name, lookup in modes:
                best = None
                for _ in range(args.repeats):
                    out, seconds = peer.generate(ids, p["max_tokens"], allow_eos=args.allow_eos, lookup=lookup)
                    first = getattr(peer, "last_first_token_s", None)  # None where the peer cannot tell (HF)
                    if best is None or seconds < best[1]:
                        best = (out, seconds, first)
                out, seconds, first = best
                runs[name] = {"tokens": len(out), "seconds": seconds, "tokens_per_s": len(out) / seconds if seconds > 0 else None,
                              "first_token_s": first, "decode_tokens_per_s": decode_rate(len(out), seconds, first), "ids": out}
            runs["identical"] = runs["lookup"]["ids"] == runs["plain"]["ids"]
            runs["first_diff"] = first_diff(runs["lookup"]["ids"], runs["plain"]["ids"])
            res["peers"][peer.name] = runs
            say(f"{p['id']}: {len(ids)} prompt tokens; {peer.name} plain {runs['plain']['tokens_per_s']:.1f} tok/s, "
                f"lookup {runs['lookup']['tokens_per_s']:.1f} tok/s, identical={runs['identical']}")
        if sf_turn is not None:
            sf_turn(p)
        results.append(res)
    return results


def _open_peers(names: list[str], gguf: Path, args) -> list:
    """The peers of ``names`` whose packages import here (the others noted); Missing when none."""
    peers, notes = [], []
    for name in names:
        cls = {"hf": HFPeer, "llama.cpp": LlamaCppPeer, "genai": GenAIPeer}[name]
        gone = missing_packages(cls)
        if gone:
            notes.append(f"{name}: missing Python package(s) {', '.join(gone)}")
            continue
        if cls is HFPeer:
            peers.append(HFPeer(gguf, args.threads))
        elif cls is GenAIPeer:
            if args.genai_model is None:
                notes.append("genai: no --genai-model DIR (its builder's output)")
                continue
            peers.append(GenAIPeer(args.genai_model, args.threads))
        else:
            peers.append(LlamaCppPeer(gguf, args.threads, args.n_ctx, args.lookup_tokens))
    for note in notes:
        say(f"left out {note}")
    if not peers:
        raise Missing("no peer to run (" + "; ".join(notes) + ").\n" + INSTALL_HINT)
    return peers


def combined_decode_rates(docs: list[dict]) -> dict[str, float | None]:
    """The decode-only rate of several ``sf-trt bench --json`` runs together: tokens after each
    request's first over each run's decode time (its tokens after the first over its own rate); None
    for a label where any run's rate is missing or absurd (a run whose prefill took all its time)."""
    out: dict[str, float | None] = {}
    for label in ("plain", "spec"):
        tokens = seconds = 0.0
        for doc in docs:
            rate = (doc.get("decode_tokens_per_s") or {}).get(label)
            after_first = sum(max(0, r[label]["tokens"] - 1) for r in doc.get("results", []))
            if not isinstance(rate, (int, float)) or not 0 < rate < 1e6:
                tokens = seconds = float("nan")
                break
            tokens, seconds = tokens + after_first, seconds + after_first / rate
        out[label] = round(tokens / seconds, 2) if seconds and seconds == seconds else None
    return out


class SfTrtTurns:
    """``sf-trt bench`` on one prompt at a time, each right after the peers ran it (so the
    machine's load hits sf_trt and the peers alike); :meth:`doc` is their results as one
    ``sf-trt bench --json`` object would hold them (its totals over these runs)."""

    def __init__(self, cmd: list[str], args) -> None:
        self.cmd, self.args = cmd, args
        self.docs: list[dict] = []
        self.notes: list[str] = []

    def __call__(self, prompt: dict) -> None:
        doc, note = run_sf_trt(self.cmd, [prompt], self.args.threads, self.args.allow_eos, self.args.sf_trt_timeout,
                               shlex.split(self.args.sf_trt_args), repeats=self.args.repeats)
        if doc is None:
            self.notes.append(f"{prompt['id']}: {note}")
            return
        self.docs.append(doc)
        sf = next(iter(doc.get("results") or []), {})
        say(f"{prompt['id']}: sf_trt plain {fmt((sf.get('plain') or {}).get('tokens_per_s'))} tok/s, "
            f"speculative {fmt((sf.get('spec') or {}).get('tokens_per_s'))} tok/s, identical={sf.get('identical')}")

    def doc(self) -> tuple[dict | None, str]:
        if not self.docs:
            return None, "; ".join(self.notes) or "no sf-trt run"
        results = [r for d in self.docs for r in d.get("results", [])]
        totals = {}
        for label in ("plain", "spec"):  # tokens over seconds, summed over the runs
            runs = [(r[label]["tokens"], r[label]["tokens"] / r[label]["tokens_per_s"]) for r in results if r[label].get("tokens_per_s")]
            totals[label] = round(sum(n for n, _ in runs) / sum(t for _, t in runs), 2) if runs else None
        note = f"{shlex.join(self.cmd)} bench, one prompt per run, after the peers' runs of it"
        return {"results": results, "throughput_tokens_per_s": totals, "decode_tokens_per_s": combined_decode_rates(self.docs),
                "settings": self.docs[0].get("settings")}, note + (
            f"; failed: {'; '.join(self.notes)}" if self.notes else "")


def _sf_trt_columns(results, prompts, args, turns: SfTrtTurns | None = None) -> tuple[dict[str, Any], Any]:
    """sf_trt's bench merged into ``results`` (run turn by turn beside the peers, or read from
    --sf-trt-json): ``(status, doc)``."""
    sf_status: dict[str, Any] = {"requested": bool(args.sf_trt or args.sf_trt_json)}
    doc = None
    if turns is not None:
        doc, note = turns.doc()
        sf_status["source" if doc is not None else "note"] = note
    elif args.sf_trt_json:
        try:
            doc = parse_json_output(args.sf_trt_json.read_text(encoding="utf-8"))
            sf_status["source"] = str(args.sf_trt_json)
            if doc is None:
                sf_status["note"] = f"{args.sf_trt_json}: no JSON object with \"results\""
        except OSError as exc:
            sf_status["note"] = f"{args.sf_trt_json}: {exc}"
    elif args.sf_trt:
        sf_status["note"] = "no `sf-trt` command on PATH (install sf_trt, or pass --sf-trt-cmd)"
    if doc is not None:
        sf_status["matched"] = merge_sf_trt(results, doc)
        if not sf_status["matched"]:
            sf_status["note"] = "sf-trt bench results share no prompt id with these prompts"
    if sf_status.get("note"):
        say(f"sf_trt columns left out: {sf_status['note']}")
    off = [r["id"] for r in results if (r.get("sf_trt") or {}).get("prompt_tokens_match") is False]
    if off:
        say(f"WARNING: sf-trt bench counted other prompt token counts than these runs on {', '.join(off)}: not a like-for-like comparison")
    return sf_status, doc


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.threads < 1 or args.warmup < 0 or args.repeats < 1 or args.lookup_tokens < 1:
        ap.error("--threads, --repeats and --lookup-tokens must be >= 1, --warmup >= 0")
    if args.max_tokens is not None and args.max_tokens < 1:
        ap.error("--max-tokens must be >= 1")
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(PEERS))
    if unknown or not names:
        ap.error(f"--peers: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(PEERS)})")
    try:
        gguf = find_gguf(args.gguf)
        if args.export_hf is not None:
            export_hf_checkpoint(gguf, args.export_hf)
            return 0
        prompts = load_prompts(args.prompts, args.only, args.max_tokens)
        sf_tok, sf_why = (None, "--prompt-ids hf") if args.prompt_ids == "hf" else sf_trt_tokenizer(gguf)
        if sf_tok is None and args.prompt_ids == "sf_trt":
            raise Missing(f"--prompt-ids sf_trt: sf_trt's tokenizer is not usable here ({sf_why})")
        # the context every llama.cpp run may need: the longest prompt, its tokens, a draft's overshoot
        longest = max(len(sf_tok.encode(sf_tok.apply_chat_template(p["messages"], add_generation_prompt=True))) + p["max_tokens"] for p in prompts) if sf_tok else 4096
        if args.prefill:
            if sf_tok is None:
                raise Missing(f"--prefill feeds every engine sf_trt's prompt ids; sf_trt's tokenizer is not usable here ({sf_why})")
            longest = max(longest, max(args.prefill) + 1)
        args.n_ctx = -(-(longest + args.lookup_tokens + 1) // 256) * 256
        peers = _open_peers(names, gguf, args)
    except Missing as exc:
        print(f"bench_peers: {exc}", file=sys.stderr)
        return 2
    hf = next((p for p in peers if p.name == "hf"), None)
    if sf_tok is None and hf is None:
        print(f"bench_peers: without HF's tokenizer the prompts need sf_trt's, which is not usable here ({sf_why})", file=sys.stderr)
        return 2
    if sf_tok is None:
        say(f"sf_trt's tokenizer not usable ({sf_why}); feeding HF's chat-template ids")
    encoded = _encode(prompts, hf.tokenizer if hf is not None else None, sf_tok)

    modes = (("plain", None), ("lookup", args.lookup_tokens))
    if args.warmup:
        p0, ids0 = encoded[0][0], encoded[0][1]
        n0 = min(32, p0["max_tokens"])
        for _ in range(args.warmup):
            for peer in peers:
                for _name, lookup in modes:
                    peer.generate(ids0, n0, allow_eos=args.allow_eos, lookup=lookup)
        say(f"warmup done ({args.warmup} x {n0} tokens per peer and mode on {p0['id']!r})")
    turns = cmd = None
    if args.sf_trt and not args.sf_trt_json:
        cmd = shlex.split(args.sf_trt_cmd) if args.sf_trt_cmd else (["sf-trt"] if shutil.which("sf-trt") else None)
        turns = SfTrtTurns(cmd, args) if cmd is not None else None
    if args.prefill:
        return prefill_main(peers, encoded, args, cmd, gguf)
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = _measure(peers, encoded, modes, args, sf_turn=turns)
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    sf_status, doc = _sf_trt_columns(results, prompts, args, turns)

    print()
    load = (f", load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} cores" if load_before and load_after else "")
    print(f"{'; '.join(peer.describe() for peer in peers)}; {args.threads} threads, prompt lookup {args.lookup_tokens} tokens, "
          f"{'EOS may stop' if args.allow_eos else 'no early EOS'}; threads {'spin' if sf_trt_spins() else 'sleep'} between ops{load}")
    print_table(results, [peer.name for peer in peers], with_sf=bool(doc is not None and sf_status.get("matched")))
    for peer in peers:
        total = lambda mode: sum(r["peers"][peer.name][mode]["tokens"] for r in results) / sum(r["peers"][peer.name][mode]["seconds"] for r in results)  # noqa: E731
        same = sum(r["peers"][peer.name]["identical"] for r in results)
        print(f"{peer.name} overall: plain {total('plain'):.1f} tok/s, prompt lookup {total('lookup'):.1f} tok/s; "
              f"prompt lookup == plain on {same}/{len(results)} prompts")
    if doc is not None:
        t = doc.get("throughput_tokens_per_s") or {}
        print(f"sf_trt overall: plain {fmt(t.get('plain'))} tok/s, speculative {fmt(t.get('spec'))} tok/s")
    bandwidth = machine_bandwidth(args.threads, args.bandwidth_mib)
    sf_model = args.sf_trt_model or cache_root() / "models" / f"{gguf.stem}-int8"
    weights = bytes_per_token(peers, gguf, sf_model if doc is not None and sf_model.is_dir() else None)
    limit = limit_report(results, doc, weights, bandwidth)
    print_limit(limit, bandwidth)
    report = {
        "tool": "tools/bench_peers.py",
        "versions": {**{k: v for peer in peers for k, v in peer.versions.items()}, "python": platform.python_version()},
        "settings": {
            "gguf": str(gguf), "prompts": str(args.prompts), "peers": [peer.name for peer in peers], "threads": args.threads,
            "device": "cpu", "lookup_tokens": args.lookup_tokens, "max_tokens_override": args.max_tokens,
            "allow_eos": args.allow_eos, "warmup": args.warmup, "repeats": args.repeats, "llama_cpp_n_ctx": args.n_ctx,
            "cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "sf_trt_spin": sf_trt_spins(),
            "tokens_per_s": "new tokens / wall time of one generate call (prefill included); fastest of the repeats",
        },
        "sf_trt": sf_status,
        "results": results,
        "limit": {"bandwidth": bandwidth, "weights": weights, "engines": limit},
    }
    args.json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    say(f"wrote {args.json_path}")
    return 0


def prefill_main(peers, encoded, args, sf_cmd: list[str] | None, gguf: Path) -> int:
    """``--prefill``: the lengths measured, the table printed, the JSON written."""
    if args.sf_trt and sf_cmd is None:
        say("sf_trt left out: no `sf-trt` command on PATH (install sf_trt, or pass --sf-trt-cmd)")
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = measure_prefill(peers, encoded, args, sf_cmd)
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    print()
    load = (f", load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} cores" if load_before and load_after else "")
    print(f"prefill, time to the first token (fastest of {PREFILL_RUNS}); {'; '.join(peer.describe() for peer in peers)}; "
          f"{args.threads} threads{load}")
    print_prefill_table(rows, [peer.name for peer in peers])
    report = {
        "tool": "tools/bench_peers.py --prefill",
        "versions": {**{k: v for peer in peers for k, v in peer.versions.items()}, "python": platform.python_version()},
        "settings": {
            "gguf": str(gguf), "prompts": str(args.prompts), "peers": [peer.name for peer in peers], "threads": args.threads,
            "device": "cpu", "lengths": args.prefill, "runs": PREFILL_RUNS, "llama_cpp_n_ctx": args.n_ctx, "llama_cpp_n_batch": 512,
            "cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "sf_trt_spin": sf_trt_spins(),
            "seconds": "time to the first token of a prompt of that many ids (the bench prompts' sf_trt ids, repeated); "
                       "tokens_per_s: prompt tokens over the fastest run",
        },
        "prefill": rows,
    }
    args.json_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    say(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
