"""``sf-trt generate``: one request, streamed as it is produced (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from sf_trt.abi import Finish
from sf_trt.scheduler import DRAFTERS

from .errors import CliError
from .flags import add_model_flags, add_sampling_flags, sampling, scheduler_config
from .launch import context_window, note, open_backend, resolve

__all__ = ["add_generate_parser", "prompt_ids", "generator", "utf8_text"]


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text, streamed as it is produced",
                       description="Generate from a prompt on the default model (SmolLM2-135M-Instruct) or a given one.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw text, tokenized as it is (control tokens written in it, like <|im_start|>, count)")
    src.add_argument("--chat", help="a user message, wrapped in the model's chat template (its text stays text: "
                     "<|im_start|> typed in it is never a control token)")
    src.add_argument("--prompt-ids", type=_parse_ids, help="token ids, comma-separated")
    g.add_argument("--speculate", choices=("none", *DRAFTERS), default="prompt-lookup",
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


def utf8_text(flag: str, text: str | None) -> str | None:
    """``text`` if it is valid UTF-8 (a command line in another encoding reaches
    Python as lone surrogates), else a CliError naming ``flag`` and the byte."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise CliError(f"{flag}: not valid UTF-8 text ({what} at character {exc.start})") from None
    return text


def prompt_ids(tok, *, prompt=None, chat=None, messages=None, ids=None) -> list[int]:
    """The prompt's token ids: given ids, a chat (one user message or messages) in
    the model's template (contents encoded as text), or raw text."""
    if ids is not None:
        return list(ids)
    if chat is not None:
        messages = [{"role": "user", "content": chat}]
    if messages is not None:
        return tok.encode_chat(messages, add_generation_prompt=True)
    return tok.encode(prompt)


def generator(prims, args, *, first_token_tick: bool = False):
    """The Generator the flags configure (draft length, tokens per tick); ``first_token_tick``:
    the first token in a tick of its own (streaming to a terminal: it shows one pass after the prefill)."""
    import dataclasses

    from sf_trt.generate import Generator

    return Generator(prims, dataclasses.replace(scheduler_config(args), first_token_tick=first_token_tick))


def cmd_generate(args) -> int:
    from sf_trt.generate import Request

    prompt, chat = utf8_text("--prompt", args.prompt), utf8_text("--chat", args.chat)
    model = resolve(args, progress=not args.json)
    tok = model.tokenizer
    ids = prompt_ids(tok, prompt=prompt, chat=chat, ids=args.prompt_ids)
    mode, params = sampling(args)
    model_context = model.model_dir.max_positions
    window = context_window(args.max_context, model_context, [("prompt", len(ids), params.max_tokens)])
    if args.max_tokens is not None and ids and len(ids) + params.max_tokens > window:
        limit = f"--max-context {window}" if args.max_context is not None else f"the model's context of {window}"
        note(f"{limit} leaves room for {window - len(ids)} tokens after the {len(ids)}-token prompt; "
             "the output stops there (finish \"context\")")
    prims = open_backend(args, model, max_lanes=1, max_context=window)
    gen = generator(prims, args, first_token_tick=not args.json)  # streamed: the first token as soon as it is drawn
    speculate = args.speculate != "none"
    request = Request(ids, mode, params, seed=args.seed, speculate=speculate, drafter=args.speculate if speculate else "prompt-lookup")
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
        if res.finish != Finish.ERROR:  # a failed run's one line is its refusal, below
            print(f"[{len(res.tokens)} tokens, {res.tokens_per_s:.1f} tok/s, finish {res.finish.name.lower()}, "
                  f"drafts {res.accepted}/{res.proposed} accepted]", file=sys.stderr)
    if res.finish == Finish.ERROR:
        print(f"sf-trt: generation failed after {len(res.tokens)} tokens: {res.error}", file=sys.stderr)
        return 1
    return 0
