"""``sf_trt.LLM``: the Python entry point for real models, in the shape vLLM's users know.

::

    import sf_trt

    llm = sf_trt.LLM()                                   # the default model, opened once
    outs = llm.generate(["Hi", "Tell me a joke"], sf_trt.SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].text, outs[0].finish_reason, outs[0].accepted)
    for delta in llm.stream(["Hi"], sf_trt.SamplingParams(max_tokens=32), seed=7):
        print(delta.text, end="")
    llm.chat([{"role": "user", "content": "Hi"}])

Requests run with continuous batching (``max_num_seqs`` lanes at a time) through the
same scheduler as ``sf-trt generate`` and ``sf-trt serve``; a batch through :class:`LLM`
emits, token for token, what the same requests emit through the server.

**Sampling parameters.** ``sf_trt.SamplingParams`` is the ABI's (SPEC.md):
``temperature`` (0: greedy, as in vLLM), ``top_p``, ``top_k`` (0: off), ``min_p``,
``max_tokens`` (0: no limit but the context) and ``flags`` (``SamplingFlag.IGNORE_EOS``).
What vLLM also puts there is per call here: ``seed`` (request ``i`` of a call draws
with ``choice_key(seed, i)``, as the server does for a list of prompts; None: a fresh
random seed), ``stop`` (strings), ``stop_token_ids`` and ``logprobs`` (how many
alternatives per token). The ABI record stays what the executor reads.

**Outputs** are :class:`~sf_trt.outputs.RequestOutput`: ``text``, ``tokens``,
``finish`` / ``finish_reason``, ``stop_reason``, ``prompt_tokens`` /
``completion_tokens`` (usage), ``proposed`` / ``accepted`` / ``drafts`` (speculation),
``logprobs``, timings. **Errors** are the command line's: ``StatusError`` (with its
``Status``) for a refused request or setting, ``ModelError`` / ``ModelDirError`` /
``GGUFError`` / ``TokenizerError`` for a model that cannot be opened, each with a
one-line message; a batch with a bad request is refused whole before any runs.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any, Iterator, Optional, Sequence, Union

from ..abi import Sampling, SamplingParams, Status, StatusError
from ..backends import BackendSpec
from ..drafting import PromptLookupConfig
from ..formats.model_dir import AUTO_WEIGHTS, DEFAULT_WEIGHTS
from ..generate import Generator
from ..grammar import Grammar, compile_grammar, token_table
from ..outputs import RequestOutput
from ..scheduler import DEFAULT_DRAFTER, DRAFTERS, Request, SchedulerConfig, choice_key
from .model import ModelSpec, resolve

__all__ = ["LLM"]

Prompt = Union[str, Sequence[int]]
Message = dict
"""``{"role": ..., "content": ...}``."""


class LLM:
    """A model opened once, ready to generate (module docstring).

    ``model``: None (the default model), a GGUF file, a model directory, or a
    :class:`~sf_trt.entrypoints.model.ModelSpec`; ``weights``: how a GGUF or the
    default model is exported (``int8``, ``float32``, ``q4``, ``int4``, ``gguf``, or ``auto``, the default:
    ``gguf`` for a GGUF of 1B+ parameters in 4-bit blocks on onnxruntime, else ``int8``). ``backend``: a backend
    name (``onnxruntime``, ``tensorrt``, ...) with ``threads``, ``engines`` and
    ``spin``, or a :class:`~sf_trt.backends.BackendSpec`. ``max_context``: positions per
    lane (default 2048, capped at the model's context); ``max_num_seqs``: lanes, the
    requests decoded at once. ``speculate``: the drafter (``prompt-lookup``,
    ``suffix``) or ``"none"``; ``max_draft``: its longest draft; ``scheduler``: a
    :class:`~sf_trt.scheduler.SchedulerConfig` (default: the batch profile, whose
    policy drafts while drafts pay). No setting changes a token.
    """

    def __init__(
        self,
        model: Union[str, "ModelSpec", None] = None,
        *,
        weights: str = AUTO_WEIGHTS,
        backend: Union[str, BackendSpec] = "onnxruntime",
        threads: Optional[int] = None,
        engines: Optional[str] = "engines",
        spin: bool = False,
        max_context: Optional[int] = None,
        max_num_seqs: int = 8,
        speculate: str = DEFAULT_DRAFTER,
        max_draft: Optional[int] = None,
        scheduler: Optional[SchedulerConfig] = None,
        progress: bool = False,
    ) -> None:
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise StatusError(Status.BAD_ARGUMENT, f"LLM: max_num_seqs must be an int >= 1 (got {max_num_seqs!r})")
        if speculate != "none" and speculate not in DRAFTERS:
            raise StatusError(Status.BAD_ARGUMENT, f"LLM: unknown drafter {speculate!r} (known: none, {', '.join(DRAFTERS)})")
        self.backend = backend if isinstance(backend, BackendSpec) else BackendSpec(backend, threads, engines, spin)
        if weights == AUTO_WEIGHTS and self.backend.name != "onnxruntime":
            weights = DEFAULT_WEIGHTS  # 4-bit blocks run on onnxruntime's CPU path only
        self.spec = ModelSpec.of(model, weights=weights)
        self.model = resolve(self.spec, progress=progress)
        self.tokenizer = self.model.tokenizer
        self.max_context = self.model.context(max_context)
        if scheduler is None:
            scheduler = SchedulerConfig(draft_config=PromptLookupConfig(max_draft=max_draft) if max_draft else ())
        self.primitives = self.backend.open(self.model.model_dir.path, max_lanes=max_num_seqs, max_context=self.max_context)
        caps = self.primitives.capabilities
        self.speculate = speculate if caps.verify_rows and caps.truncate_partial else "none"
        self.generator = Generator(self.primitives, scheduler, tokenizer=self.tokenizer)

    # -- requests --------------------------------------------------------------------------------

    def requests(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        *,
        seed: Optional[int] = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        logprobs: Optional[int] = None,
    ) -> list[Request]:
        """The scheduler's requests for ``prompts`` (text, token ids, or a list of either)
        under ``sampling_params`` (one for all, or one per prompt); what :meth:`generate`
        runs. Temperature 0 is greedy."""
        batch = _prompt_list(prompts)
        params = _params_list(sampling_params, len(batch))
        seed = secrets.randbits(63) if seed is None else seed
        speculate = self.speculate != "none"
        out = []
        for i, (prompt, p) in enumerate(zip(batch, params)):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            greedy = p.temperature == 0
            mode = Sampling.GPU_GREEDY if greedy else Sampling.GPU_GUMBEL
            if greedy:  # the temperature is not read under GPU_GREEDY; every other field is kept
                p = dataclasses.replace(p, temperature=1.0)
            out.append(Request(
                ids, mode, p, seed=choice_key(seed, i), speculate=speculate, drafter=self.speculate if speculate else DEFAULT_DRAFTER,
                stop=tuple(stop), stop_token_ids=tuple(stop_token_ids), logprobs=logprobs,
            ))
        return out

    def grammar(self, kind: str, source: Any = None) -> Grammar:
        """A constraint for :class:`SamplingParams`'s ``grammar``, compiled for this model's
        tokenizer: ``kind`` one of ``json_schema`` (a schema dict or its text),
        ``json_object``, ``regex``, ``choice`` (a list of strings), ``lark`` (Lark or GBNF).
        Raises :class:`sf_trt.grammar.GrammarError` naming what cannot be compiled.
        ``llm.generate(p, SamplingParams(max_tokens=200, grammar=llm.grammar("json_schema", schema)))``."""
        if getattr(self, "_token_table", None) is None:
            caps = self.primitives.capabilities
            self._token_table = token_table(self.tokenizer, caps.vocab, caps.eos)  # about a second, once
        return compile_grammar(kind, source, self._token_table)

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        **options: Any,
    ) -> list[RequestOutput]:
        """Run ``prompts`` (text, token ids, or a list of either) to their finish with
        continuous batching; one cumulative output per prompt, in order. ``options``:
        ``seed``, ``stop``, ``stop_token_ids``, ``logprobs`` (module docstring)."""
        return self.generator.run(self.requests(prompts, sampling_params, **options))

    def stream(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        **options: Any,
    ) -> Iterator[RequestOutput]:
        """As :meth:`generate`, yielding deltas as the tokens come (``index``: the prompt's
        position; each prompt's last delta carries its finish). The batch is checked before
        this returns; leaving the loop early aborts what still runs."""
        return self.generator.stream(self.requests(prompts, sampling_params, **options))

    def chat(
        self,
        messages: Union[Sequence[Message], Sequence[Sequence[Message]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        **options: Any,
    ) -> list[RequestOutput]:
        """:meth:`generate` for one conversation (a list of ``{"role", "content"}``) or a
        list of them, each rendered in the model's chat template with the assistant's
        turn opened; contents stay text (typed control tokens are never control tokens)."""
        return self.generate(self.chat_prompts(messages), sampling_params, **options)

    def chat_prompts(self, messages: Union[Sequence[Message], Sequence[Sequence[Message]]]) -> list[list[int]]:
        """The token ids of each conversation in ``messages`` (see :meth:`chat`)."""
        if isinstance(messages, Sequence) and messages and isinstance(messages[0], dict):
            messages = [messages]
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
            raise StatusError(Status.BAD_ARGUMENT, f"chat: messages must be a conversation or a list of them (got {type(messages).__name__})")
        return [self.tokenizer.encode_chat(list(conv), add_generation_prompt=True) for conv in messages]

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release the backend (sessions, device memory)."""
        self.primitives.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _prompt_list(prompts: Any) -> list[Prompt]:
    """One prompt (text or token ids) as a batch of one; a batch as it is."""
    if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and all(_is_id(t) for t in prompts)):
        return [prompts]
    if isinstance(prompts, Sequence) and not isinstance(prompts, (bytes, bytearray)) and prompts:
        bad = [i for i, p in enumerate(prompts) if not (isinstance(p, str) or (isinstance(p, Sequence) and all(_is_id(t) for t in p)))]
        if not bad:
            return list(prompts)
        raise StatusError(Status.BAD_ARGUMENT, f"generate: prompt {bad[0]} must be text or a list of token ids (got {prompts[bad[0]]!r:.60})")
    raise StatusError(Status.BAD_ARGUMENT, f"generate: prompts must be text, token ids or a non-empty list of either (got {prompts!r:.60})")


def _is_id(token: Any) -> bool:
    return isinstance(token, int) and not isinstance(token, bool)


def _params_list(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, Sequence) and all(isinstance(p, SamplingParams) for p in params):
        if len(params) != n:
            raise StatusError(Status.BAD_ARGUMENT, f"generate: {len(params)} sampling params for {n} prompts (give one, or one per prompt)")
        return list(params)
    raise StatusError(Status.BAD_ARGUMENT, f"generate: sampling_params must be a SamplingParams or a list of them (got {type(params).__name__})")
