"""``sf-trt generate``: one request, streamed as it is produced (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from sf_trt.abi import Finish

from .flags import add_model_flags, add_sampling_flags, sampling
from .launch import context_for, open_backend, resolve

__all__ = ["add_generate_parser", "prompt_ids", "generator"]


def add_generate_parser(sub) -> None:
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
    add_sampling_flags(g, 256)
    add_model_flags(g)
    g.set_defaults(func=cmd_generate)


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids like 1,2,3, got {text!r}") from None


def prompt_ids(tok, *, prompt=None, chat=None, messages=None, ids=None) -> list[int]:
    """The prompt's token ids: given ids, a chat (one user message or messages) in
    the model's template, or raw text."""
    if ids is not None:
        return list(ids)
    if chat is not None:
        messages = [{"role": "user", "content": chat}]
    if messages is not None:
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
    return tok.encode(prompt)


def generator(prims, args):
    """The Generator the flags configure (draft length, tokens per tick)."""
    from sf_trt.drafting import PromptLookupConfig
    from sf_trt.generate import Generator

    return Generator(prims, draft_config=PromptLookupConfig(max_draft=args.max_draft), tick_tokens=args.tick_tokens)


def cmd_generate(args) -> int:
    from sf_trt.generate import Request

    model = resolve(args, progress=not args.json)
    tok = model.tokenizer
    ids = prompt_ids(tok, prompt=args.prompt, chat=args.chat, ids=args.prompt_ids)
    mode, params = sampling(args)
    prims = open_backend(args, model, max_lanes=1, max_context=context_for(args.max_context, [len(ids) + params.max_tokens]))
    gen = generator(prims, args)
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
            "proposed": res.proposed, "accepted": res.accepted, "error": res.error,
        }))
    else:
        sys.stdout.write(stream.flush() + "\n")
        print(f"[{len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, finish {res.finish.name.lower()}, "
              f"drafts {res.accepted}/{res.proposed} accepted]", file=sys.stderr)
    if res.finish == Finish.ERROR:
        print(f"sf-trt: generation failed after {len(res.tokens)} tokens: {res.error}", file=sys.stderr)
        return 1
    return 0
