"""lm-eval's multiple-choice scores, computed directly: the check that ``lm_eval --model
local-completions`` against ``sf-trt serve`` scores what the model scores.

For each question of an lm-eval task YAML over a local JSON/JSONL dataset (the
``{{field}}`` forms of ``doc_to_choice`` and ``doc_to_target``), each choice is a
loglikelihood request split as lm-eval splits it (the context's trailing spaces move to
the continuation; the continuation's tokens are those of context + continuation past the
context's). Its loglikelihood is the sum of the continuation's prompt logprobs, scored by
the executor in the prefill (``prompt_logprobs``, ``prompt_only``): the rows the server's
``echo`` + ``logprobs`` + ``max_tokens: 0`` reads. The answer is the argmax (lm-eval's
``acc``). With ``--samples`` (the ``samples_<task>_*.jsonl`` of ``lm_eval --log_samples``)
it compares per choice and per question; with ``--url`` it also asks a running server
with lm-eval's own requests (:func:`served_loglikelihoods`: the check without lm-eval).
It exits 1 on a difference. No torch, no lm-eval::

    python tools/lm_eval_check.py --task tools/lm_eval/capitals.yaml --samples out/*/samples_sf_trt_capitals_*.jsonl
    python tools/lm_eval_check.py --url http://127.0.0.1:8001 --served-model-name smollm2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import jinja2
import numpy as np
import yaml

from sf_trt.generate import Generator
from sf_trt.scheduler import Request

ROOT = Path(__file__).resolve().parents[1]
FIELD = re.compile(r"^\{\{\s*(\w+)\s*\}\}$")


@dataclasses.dataclass(frozen=True)
class Question:
    context: str
    continuations: tuple[str, ...]
    answer: int


def _field(doc: dict, template: Any, what: str) -> Any:
    if isinstance(template, (int, list)):
        return template
    m = FIELD.match(str(template).strip())
    if m is None or m.group(1) not in doc:
        raise SystemExit(f"lm_eval_check: {what} must be '{{{{field}}}}' naming a dataset field (got {template!r})")
    return doc[m.group(1)]


def load_task(task_yaml: Path, root: Path = ROOT) -> list[Question]:
    """The task's questions, in dataset order (lm-eval's ``doc_id``); ``data_files`` paths
    are relative to ``root`` (where ``lm_eval`` runs)."""
    task = yaml.safe_load(Path(task_yaml).read_text())
    if task.get("output_type") != "multiple_choice" or task.get("dataset_path") != "json":
        raise SystemExit(f"lm_eval_check: {task_yaml}: expected output_type multiple_choice over dataset_path json")
    split = task.get("test_split") or task.get("validation_split")
    files = task["dataset_kwargs"]["data_files"][split]
    docs = [json.loads(line) for f in ([files] if isinstance(files, str) else files)
            for line in (root / f).read_text().splitlines() if line.strip()]
    text = jinja2.Template(task["doc_to_text"], keep_trailing_newline=True)
    delim = task.get("target_delimiter", " ")
    return [Question(text.render(**d), tuple(delim + str(c) for c in _field(d, task["doc_to_choice"], "doc_to_choice")),
                     int(_field(d, task["doc_to_target"], "doc_to_target"))) for d in docs]


def encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of a loglikelihood request into context and continuation tokens."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = list(tok.encode(context + continuation)), list(tok.encode(context))
    if not ctx:
        raise SystemExit(f"lm_eval_check: an empty context (lm-eval scores it after the EOS token): {context!r}")
    return ctx, whole[len(ctx):]


def loglikelihoods(gen: Generator, tok: Any, questions: Sequence[Question]) -> list[list[list[float]]]:
    """Per question, per choice: the continuation tokens' logprobs, from the prefill's rows."""
    pairs = [encode_pair(tok, q.context, c) for q in questions for c in q.continuations]
    outs = gen.run([Request(ctx + cont, prompt_logprobs=0, prompt_only=True, speculate=False) for ctx, cont in pairs])
    flat = [[float(x) for x in out.prompt_logprobs.logprob[len(ctx) - 1:]] for (ctx, _), out in zip(pairs, outs)]
    it = iter(flat)
    return [[next(it) for _ in q.continuations] for q in questions]


def served_loglikelihoods(url: str, model: str, tok: Any, questions: Sequence[Question]) -> list[list[list[float]]]:
    """As :func:`loglikelihoods`, through a server the way lm-eval's ``local-completions``
    asks (lm-eval 0.4.13's payload: token-id prompt, ``echo``, ``logprobs: 1``,
    ``max_tokens: 1``, temperature 0) and reads (``token_logprobs[ctxlen:-1]``: the last is
    the generated token's). ``url``: the server's root."""
    import httpx

    out = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for q in questions:
            per = []
            for cont in q.continuations:
                ctx, ids = encode_pair(tok, q.context, cont)
                r = client.post("/v1/completions", json={"model": model, "prompt": ctx + ids, "temperature": 0, "max_tokens": 1,
                                                         "logprobs": 1, "seed": 1234, "echo": True})
                r.raise_for_status()
                per.append(r.json()["choices"][0]["logprobs"]["token_logprobs"][len(ctx):-1])
            out.append(per)
    return out


def score(questions: Sequence[Question], lls: Sequence[Sequence[Sequence[float]]]) -> list[dict]:
    """Per question: each choice's loglikelihood (the sum, in order, as lm-eval sums the
    JSON's values), the argmax and whether it is the answer."""
    rows = []
    for i, (q, per) in enumerate(zip(questions, lls)):
        sums = [sum(tokens) for tokens in per]
        pick = int(np.argmax(sums))
        rows.append({"doc_id": i, "loglikelihoods": sums, "pick": pick, "acc": float(pick == q.answer)})
    return rows


def compare(rows: Sequence[dict], samples: Sequence[dict]) -> dict:
    """``rows`` (:func:`score`) against lm-eval's logged samples: accuracies, the largest
    |Δ loglikelihood|, and the doc ids whose pick or acc differ."""
    by_id = {int(s["doc_id"]): s for s in samples}
    if sorted(by_id) != [r["doc_id"] for r in rows]:
        raise SystemExit(f"lm_eval_check: the samples cover doc ids {sorted(by_id)}, the task {len(rows)} questions")
    delta, differ = 0.0, []
    for r in rows:
        theirs = [float(resp[0]) for resp in by_id[r["doc_id"]]["filtered_resps"]]
        if len(theirs) != len(r["loglikelihoods"]):
            raise SystemExit(f"lm_eval_check: doc {r['doc_id']}: {len(theirs)} choices logged, {len(r['loglikelihoods'])} in the task")
        delta = max([delta] + [abs(a - b) for a, b in zip(theirs, r["loglikelihoods"])])
        if int(np.argmax(theirs)) != r["pick"] or float(by_id[r["doc_id"]]["acc"]) != r["acc"]:
            differ.append(r["doc_id"])
    return {"acc_direct": sum(r["acc"] for r in rows) / len(rows),
            "acc_lm_eval": sum(float(s["acc"]) for s in samples) / len(samples),
            "max_abs_delta": delta, "differ": differ}


def as_samples(rows: Sequence[dict]) -> list[dict]:
    """:func:`score`'s rows in the shape of lm-eval's logged samples (what :func:`compare` reads)."""
    return [{"doc_id": r["doc_id"], "filtered_resps": [[x, False] for x in r["loglikelihoods"]], "acc": r["acc"]} for r in rows]


def read_samples(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=Path, default=ROOT / "tools/lm_eval/capitals.yaml", help="the lm-eval task YAML")
    ap.add_argument("--samples", type=Path, help="lm-eval's samples_<task>_*.jsonl (from --log_samples) to compare with")
    ap.add_argument("--model", default=None, help="a model as sf-trt serve takes it (default: the default model)")
    ap.add_argument("--url", help="also ask this server (its root: http://127.0.0.1:8000) as lm-eval would, and compare")
    ap.add_argument("--served-model-name", default="smollm2", help="the model id to send with --url")
    ap.add_argument("--tolerance", type=float, default=0.0, help="the largest |Δ loglikelihood| that still agrees")
    args = ap.parse_args(argv)

    import sf_trt

    questions = load_task(args.task)
    with sf_trt.LLM(args.model, max_num_seqs=4, max_context=512) as llm:
        tok = llm.tokenizer
        rows = score(questions, loglikelihoods(llm.generator, tok, questions))
    for r in rows:
        print(f"doc {r['doc_id']}: pick {r['pick']} acc {r['acc']:.0f} " + " ".join(f"{x:.6f}" for x in r["loglikelihoods"]))
    print(f"direct acc {sum(r['acc'] for r in rows) / len(rows):.4f} over {len(rows)} questions")
    checks = []
    if args.samples is not None:
        checks.append(("lm-eval", read_samples(args.samples)))
    if args.url:
        served = score(questions, served_loglikelihoods(args.url, args.served_model_name, tok, questions))
        checks.append((args.url, as_samples(served)))
    ok = True
    for name, samples in checks:
        c = compare(rows, samples)
        print(f"{name}: acc {c['acc_lm_eval']:.4f}; max |Δ loglikelihood| {c['max_abs_delta']:.3g}; differing docs {c['differ']}")
        ok = ok and not c["differ"] and c["acc_direct"] == c["acc_lm_eval"] and c["max_abs_delta"] <= args.tolerance
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
