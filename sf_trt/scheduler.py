"""The one scheduler of whole requests over the Executor.

Both the batch :class:`~sf_trt.generate.Generator` and the serving
:class:`~sf_trt.engine_loop.EngineLoop` drive an Executor through this class.
One :meth:`Scheduler.step` reads like this::

    plan       admit waiting sequences into free lanes (oldest first); prefill
               prompt chunks (per lane ``prefill_chunk``, per tick ``prefill_budget``)
               beside the lanes that decode ``tick_tokens`` each, with the draft
               cap the drafting policy sets for the tick
    tick       Executor.tick(plan)
    apply      each lane's new tokens through its sequence: stop token ids and stop
               strings cut the output at the token that completes them; text and
               logprobs follow the cut
    release    lanes a stop ended are released at once, in a tick of their own

Exactness: the scheduler decides when a lane runs, how many tokens it is asked
for and how long its drafts may be, never which token a position draws; a
sequence's tokens are what the same request emits alone without speculation
(SPEC behaviours 3 and 4). A stop string is matched on the decoded text, and the
output ends at the token that completes the match: no token, text or logprob after
it is ever reported, even when the tick ran further (inside a run of accepted
draft tokens, say).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterator, Optional, Sequence as Seq, Union


from .abi import Finish, Sampling, SamplingParams, Status, StatusError
from .drafting import DEFAULT_SCOPE
from .engine import Emit, Events, Plan, TokenLogprobs
from .executor import Executor, check_draft_scope
from .strategies import KINDS

__all__ = [
    "Request", "strategy_id", "DRAFTERS", "FINISH_ERROR", "choice_key", "Sequence", "Update", "DraftPolicy", "LoadAwareDrafting", "Scheduler",
]

FINISH_ERROR = Finish.ERROR
"""How a request that failed ends (``Finish.ERROR`` where the fault-safe executor defines
it); its ``error`` says why."""


# -- requests ----------------------------------------------------------------------------------


def strategy_id(kind: str) -> bytes:
    """The 32-byte id a drafter kind is registered under."""
    return f"sf_trt.{kind}.v1".encode().ljust(32, b"\0")


class _Drafters(Mapping):
    """Drafter names as requests and users spell them (``prompt-lookup``, ``suffix``)
    to their strategy kind (:data:`sf_trt.strategies.KINDS`), read live, so a kind
    registered with ``register_drafter_kind`` is a drafter requests can name.
    ``prompt_lookup`` is read as ``prompt-lookup``."""

    def __getitem__(self, name: str) -> str:
        kind = name.replace("-", "_") if isinstance(name, str) else None
        if kind not in KINDS:
            raise KeyError(name)
        return kind

    def __iter__(self) -> Iterator[str]:
        return (kind.replace("_", "-") for kind in KINDS)

    def __len__(self) -> int:
        return len(KINDS)


DRAFTERS: Mapping = _Drafters()
"""Drafters by the name requests use (``Request.drafter``, the server's ``speculate``)."""

DEFAULT_DRAFTER = "prompt-lookup"


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation: ``prompt_ids`` continued under ``sampling``/``params``.

    ``params.max_tokens`` bounds the output (0: until EOS or the context).
    ``seed`` is the lane's RNG counter base (see :func:`choice_key` for ``n > 1``).
    ``speculate`` turns drafting on with ``drafter`` (a :data:`DRAFTERS` name) drafting
    at most ``max_draft`` tokens per pass (0: the drafter's own cap).
    ``draft_scope``: whose finished requests the suffix drafter may draft from and
    whose corpus this one joins (a tenant; see :mod:`sf_trt.drafting.suffix`); None
    keeps it private.
    ``stop`` (strings, matched on the decoded text; needs a tokenizer) and
    ``stop_token_ids`` end the output with ``Finish.STOP``; ``logprobs`` asks for each
    token's logprob and that many alternatives (None: none).
    """

    prompt_ids: Seq[int]
    sampling: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    seed: int = 0
    speculate: bool = True
    drafter: str = DEFAULT_DRAFTER
    max_draft: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: Optional[int] = None
    draft_scope: Optional[str] = DEFAULT_SCOPE


_MASK64 = 2**64 - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def choice_key(seed: int, index: int) -> int:
    """The RNG counter base of choice ``index`` of a request seeded ``seed`` (both >= 0).

    Choice 0 uses the seed itself, so ``sf-trt generate --seed S`` reproduces it. Choice
    ``i > 0`` uses ``splitmix64(splitmix64(seed) XOR i) >> 1`` (SplitMix64, 64-bit
    wrap-around; ``>> 1`` keeps the key in 0..2**63-1): choices are independent streams,
    and choice 1 of seed 42 is not choice 0 of seed 43 (``seed + i`` would make it so).
    """
    if not 0 <= seed < 2**63 or index < 0:
        raise StatusError(Status.BAD_SAMPLING_PARAMS, f"choice_key: seed must be in 0..2**63-1 and index >= 0 (got {seed}, {index})")
    if index == 0:
        return seed
    return _splitmix64(_splitmix64(seed) ^ index) >> 1


# -- sequences -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Update:
    """What one step added to one sequence: tokens, text (``None`` without a tokenizer),
    logprobs, and whether it finished (``seq.finish`` says how)."""

    seq: "Sequence"
    tokens: list[int]
    text: Optional[str]
    logprobs: Optional[TokenLogprobs]
    finished: bool


ACCEPTANCE_PRIOR = (2.0, 4.0)
"""A new lane's draft record: 2 of 4 draft tokens accepted, worth about one short draft."""
ACCEPTANCE_DECAY = 0.75
"""Each tick with drafts keeps this share of the lane's earlier record (older ticks fade)."""


class Sequence:
    """A request's progress through the scheduler: its lane, its output, its timings.

    Invariant: ``tokens`` are what the lane emitted up to the cut (a stop), and
    ``text`` is their decoded text cut at the stop string's start.
    """

    def __init__(self, seq_id: int, request: Request, prompt_len: int, decoder: Any, arrival: float) -> None:
        self.seq_id = seq_id
        self.request = request
        self.prompt_len = prompt_len
        self.prompt_id = 0  # the executor's, while registered
        self.prefilled_len = 0
        self.admitted = False
        self.tokens: list[int] = []
        self.finish = Finish.NONE
        self.stop_reason: Optional[str | int] = None
        self.error: Optional[str] = None
        self.proposed = self.accepted = self.drafts = self.passes = 0
        self.recent_accepted, self.recent_proposed = ACCEPTANCE_PRIOR
        """Draft tokens accepted and proposed, decayed by :data:`ACCEPTANCE_DECAY` each tick
        with drafts, starting from :data:`ACCEPTANCE_PRIOR` (what :attr:`acceptance` reads)."""
        self.tokens_per_pass = 1.0
        """Moving average of tokens emitted per decode pass in ticks the lane could draft in."""
        self.draft_rows_per_pass = 0.0
        """Moving average of draft tokens sent per decode pass in ticks the lane could draft in."""
        self.drafted_ticks = 0
        """Ticks the lane could draft in (the drafter may have found nothing to propose)."""
        self.ticks_since_draft = 0
        """Decoding ticks since the lane last could draft (the drafting policy's probes read it)."""
        self.may_draft = False  # in the current tick
        self.logprobs_parts: list[TokenLogprobs] = []
        self._decoder = decoder
        self.text: Optional[str] = "" if decoder is not None else None
        self._text_sent = 0
        self._holdback = max((len(s) for s in request.stop), default=1) - 1
        self._stop_ids = frozenset(request.stop_token_ids)
        self.arrival = arrival
        self.admitted_at: Optional[float] = None
        self.first_token_at: Optional[float] = None
        self.finished_at: Optional[float] = None

    @property
    def decoding(self) -> bool:
        return self.admitted and self.prefilled_len == self.prompt_len

    @property
    def acceptance(self) -> float:
        """The share of recent draft tokens accepted (the prior's 0.5 before any drafts)."""
        return self.recent_accepted / self.recent_proposed

    @property
    def logprobs(self) -> Optional[TokenLogprobs]:
        if self.request.logprobs is None:
            return None
        return TokenLogprobs.concat(self.logprobs_parts, self.request.logprobs)

    def _append(self, new: list[int]) -> int:
        """Push ``new`` through the stop checks; how many of them the output keeps."""
        for i, tok in enumerate(new):
            if tok in self._stop_ids:  # kept as a token, never as text (vLLM's rule)
                self.finish, self.stop_reason = Finish.STOP, tok
                return i + 1
            if self._decoder is None:
                continue
            if self._push_text(self._decoder.push(tok)):
                return i + 1
        return len(new)

    def _push_text(self, piece: str) -> bool:
        """Append decoded text; True (and the text cut, the finish set) if it completes a stop."""
        before = len(self.text)
        self.text += piece
        hit = None  # (start, stop): the earliest match that ends in the new text
        for s in self.request.stop:
            at = self.text.find(s, max(0, before - len(s) + 1))
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, s)
        if hit is None:
            return False
        self.text = self.text[: hit[0]]
        self.finish, self.stop_reason = Finish.STOP, hit[1]
        return True

    def _take_text(self) -> Optional[str]:
        """Text not yet reported; while running, a possible stop string's start is held back."""
        if self.text is None:
            return None
        if self.finish == Finish.NONE:
            end = max(self._text_sent, len(self.text) - self._holdback)
        else:
            if self.finish != Finish.STOP:
                self._push_text(self._decoder.flush())  # an unfinished character at the end, as U+FFFD
            end = len(self.text)
        out, self._text_sent = self.text[self._text_sent : end], end
        return out

    def apply(self, emit: Emit, new: list[int], now: float) -> Update:
        """Take one tick's emit; the update to report (cut at a stop)."""
        self.passes += emit.passes
        spec = emit.spec
        self.proposed += spec.proposed
        self.accepted += spec.accepted
        self.drafts += spec.drafts
        if spec.proposed:
            self.recent_accepted = ACCEPTANCE_DECAY * self.recent_accepted + spec.accepted
            self.recent_proposed = ACCEPTANCE_DECAY * self.recent_proposed + spec.proposed
        if self.may_draft and emit.passes:
            self.tokens_per_pass = 0.5 * self.tokens_per_pass + 0.5 * len(new) / emit.passes
            self.draft_rows_per_pass = 0.5 * self.draft_rows_per_pass + 0.5 * spec.proposed / emit.passes
            self.drafted_ticks += 1
        self.ticks_since_draft = 0 if self.may_draft else self.ticks_since_draft + 1
        keep = self._append(new)
        tokens = new[:keep]
        logprobs = emit.logprobs[:keep] if emit.logprobs is not None else None
        if self.finish == Finish.NONE and emit.finish != Finish.NONE:
            self.finish = emit.finish
            self.error = getattr(emit, "error", None)
        self.tokens += tokens
        if logprobs is not None:
            self.logprobs_parts.append(logprobs)
        if tokens and self.first_token_at is None:
            self.first_token_at = now
        if self.finish != Finish.NONE:
            self.finished_at = now
        return Update(self, tokens, self._take_text(), logprobs, self.finish != Finish.NONE)

    def end(self, finish: Finish, now: float, error: Optional[str] = None) -> Update:
        """Finish now (aborted, failed) with what was reported so far."""
        self.finish, self.error, self.finished_at = finish, error, now
        lp = None if self.request.logprobs is None else TokenLogprobs.concat([], self.request.logprobs)
        return Update(self, [], self._take_text(), lp, True)


# -- the drafting policy -------------------------------------------------------------------------


class DraftPolicy:
    """Decides, each tick, what every decoding lane is asked for: ``(tokens, max_draft)``
    (``Decode.n`` and ``Decode.max_draft``: None leaves the draft length to the drafter,
    0 turns drafting off). The base class asks every lane for ``tick_tokens`` and lets
    lanes that speculate draft as their drafter likes, whatever the batch (tests and
    benchmarks that must see drafts use it; the default is :class:`LoadAwareDrafting`)."""

    def plan(self, seqs: list[Sequence], tick_tokens: int) -> dict[int, tuple[int, Optional[int]]]:
        return {seq.seq_id: (tick_tokens, None) for seq in seqs}


@dataclasses.dataclass
class LoadAwareDrafting(DraftPolicy):
    """Drafts only while it pays: sheds drafting when the batch is large or a lane's
    drafts are rarely taken, so speculation does not make decoding slower than plain.
    The default of :class:`~sf_trt.generate.Generator` and the serving engine loop.

    On a CPU a verify row costs real compute, and a pass pads every lane to the
    longest one's rows, so one lane's draft makes the whole batch's pass dearer.
    Measured on the decoder (docs/benchmarks.md, ``tools/bench_rows.py``), one more
    row per lane costs about 0.06-0.23 of a pass at 1 lane, 0.17-0.29 at 4 and 0.5 at
    8: modelled as ``row_cost * B / (B + row_cost_lanes)`` passes. The policy, each tick, with ``B`` decoding
    lanes:

    * **row budget**: a lane drafts at most ``k = row_budget // B - 1`` tokens per
      pass; from ``B >= row_budget / 2`` on, ``k = 0`` and nobody drafts
      (TensorRT-LLM turns n-gram drafting off above a concurrency, too);
    * **probes**: a lane that has not drafted yet, or not for ``probe_every`` of its
      ticks, drafts this tick (within the row budget), so a new request starts
      drafting at once and a lane's estimates stay current;
    * **acceptance**: otherwise a lane drafts only if the share of its recent draft
      tokens that were accepted (:attr:`Sequence.acceptance`) reaches the row cost at
      ``B`` (and ``min_acceptance``): alone, a draft token costs about
      ``row_cost_at(1)`` of a pass and saves a pass when taken;
    * **gain against cost**: with more than one lane, they draft this tick only if
      the tokens drafts added per pass, as a share of the batch (the sum over the
      speculating lanes that have drafted of each one's moving tokens-per-pass minus
      one, over ``B``), reach what the padding costs the batch (the row cost at ``B``
      times the most draft tokens one of them sent per pass); drafts that propose
      nothing cost nothing;
    * **balanced ticks**: a tick lasts until its slowest lane has its tokens, so a
      lane whose drafts are taken would finish early and sit idle; a drafting lane
      is asked for ``tick_tokens`` times its tokens-per-pass instead, so every lane
      needs about ``tick_tokens`` passes and the batch, not one lane, goes faster.

    Tokens and draft rows per pass are moving averages that halve toward each tick's
    value; acceptance fades by :data:`ACCEPTANCE_DECAY`. A draft never changes a token,
    so the policy changes speed only.
    """

    row_budget: int = 8
    row_cost: float = 0.6
    row_cost_lanes: float = 4.0
    min_acceptance: float = 0.1
    probe_every: int = 16

    def __post_init__(self) -> None:
        if (self.row_budget < 1 or self.row_cost < 0 or self.row_cost_lanes < 0
                or not 0.0 <= self.min_acceptance <= 1.0 or self.probe_every < 1):
            raise StatusError(
                Status.BAD_ARGUMENT,
                "LoadAwareDrafting: need row_budget >= 1, row_cost >= 0, row_cost_lanes >= 0, min_acceptance in [0, 1], "
                f"probe_every >= 1 (got {self.row_budget}, {self.row_cost}, {self.row_cost_lanes}, {self.min_acceptance}, "
                f"{self.probe_every})",
            )

    def row_cost_at(self, lanes: int) -> float:
        """One more row per lane, in passes, at ``lanes`` decoding lanes."""
        return self.row_cost * lanes / (lanes + self.row_cost_lanes)

    def draft_cap(self, lanes: int) -> int:
        """The most draft tokens per pass a lane may send at ``lanes`` decoding lanes (0: none)."""
        return max(0, self.row_budget // max(1, lanes) - 1)

    def probes(self, seq: Sequence) -> bool:
        """Whether ``seq`` drafts this tick to measure: it never has, or not for ``probe_every`` ticks."""
        return seq.drafted_ticks == 0 or seq.ticks_since_draft >= self.probe_every

    def drafting_pays(self, seqs: list[Sequence]) -> bool:
        """Whether the speculating lanes' measured gain covers what their draft rows cost the batch."""
        measured = [s for s in seqs if s.request.speculate and s.drafted_ticks]
        if len(seqs) == 1 or not measured:
            return True
        gain = sum(s.tokens_per_pass - 1.0 for s in measured) / len(seqs)
        return gain >= self.row_cost_at(len(seqs)) * max(s.draft_rows_per_pass for s in measured)

    def plan(self, seqs: list[Sequence], tick_tokens: int) -> dict[int, tuple[int, Optional[int]]]:
        k = self.draft_cap(len(seqs))
        pays = k > 0 and self.drafting_pays(seqs)
        threshold = max(self.min_acceptance, self.row_cost_at(len(seqs)))
        out: dict[int, tuple[int, Optional[int]]] = {}
        for seq in seqs:
            if not seq.request.speculate:
                out[seq.seq_id] = (tick_tokens, None)
            elif k and (self.probes(seq) or (pays and seq.acceptance >= threshold)):
                per_pass = min(seq.tokens_per_pass, 1 + k)
                out[seq.seq_id] = (max(tick_tokens, round(tick_tokens * per_pass)), k)
            else:
                out[seq.seq_id] = (tick_tokens, 0)
        return out


# -- the scheduler -------------------------------------------------------------------------------


class Scheduler:
    """Admits, prefills, decodes and releases sequences on one Executor (module docstring).

    Not thread-safe: one thread calls every method (the engine loop's, or the
    Generator's caller). ``tokenizer`` (anything with ``stream(skip_special=...)``)
    is needed for text and stop strings.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        tick_tokens: int = 16,
        prefill_chunk: int = 256,
        prefill_budget: Optional[int] = None,
        draft_config: Union[Any, Seq[Any], None] = None,
        policy: Optional[DraftPolicy] = None,
        tokenizer: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        for name, value in (("tick_tokens", tick_tokens), ("prefill_chunk", prefill_chunk), ("prefill_budget", prefill_budget or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StatusError(Status.BAD_ARGUMENT, f"Scheduler: {name} must be an int >= 1 (got {value!r})")
        self.executor = executor
        self.caps = executor.caps
        self.tick_tokens = tick_tokens
        self.prefill_chunk = prefill_chunk
        self.prefill_budget = prefill_budget
        configs = list(draft_config) if isinstance(draft_config, (list, tuple)) else [] if draft_config is None else [draft_config]
        self.draft_configs: dict[str, Any] = {}
        """Each drafter kind's configuration (kinds not named here: their defaults)."""
        for config in configs:
            kind = next((name for name, k in KINDS.items() if isinstance(config, k.config_type)), None)
            if kind is None:
                raise StatusError(Status.BAD_ARGUMENT, f"Scheduler: draft_config {type(config).__name__} is no drafter kind's config (kinds: {sorted(KINDS)})")
            self.draft_configs[kind] = config
        self.policy = policy if policy is not None else LoadAwareDrafting()
        self.tokenizer = tokenizer
        self.clock = clock
        self.can_speculate = bool(self.caps.verify_rows and self.caps.truncate_partial)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: dict[int, Sequence] = {}  # by lane id (= seq id), in admission order
        self._slots: dict[str, int] = {}

    # -- requests in and out ---------------------------------------------------------------

    def check(self, request: Request, name: str = "request") -> None:
        """Refuse (StatusError) a request this scheduler cannot run, before it is queued;
        the message starts with ``name``."""
        if request.speculate:
            if not self.can_speculate:
                raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, f"{name}: this backend cannot speculate (no verify rows or partial rollback)")
            if request.drafter not in DRAFTERS:
                raise StatusError(Status.BAD_ARGUMENT, f"{name}: unknown drafter {request.drafter!r} (known: {sorted(DRAFTERS)})")
        if isinstance(request.max_draft, bool) or not isinstance(request.max_draft, int) or not 0 <= request.max_draft <= 256:
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: max_draft must be an int in 0..256 (got {request.max_draft!r})")
        check_draft_scope(request.draft_scope, name)
        if request.stop and self.tokenizer is None:
            raise StatusError(Status.UNSUPPORTED, f"{name}: stop strings need a tokenizer (none was given)")
        if any(not isinstance(s, str) or not s for s in request.stop):
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: stop strings must be non-empty str (got {list(request.stop)!r})")
        bad = [t for t in request.stop_token_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.caps.vocab]
        if bad:
            raise StatusError(Status.TOKEN_OUT_OF_VOCAB, f"{name}: stop token ids {bad} outside 0..{self.caps.vocab - 1}")
        held = self.executor.quarantined
        if len(held) >= self.caps.max_lanes:
            raise StatusError(
                Status.CAPACITY_EXHAUSTED,
                f"{name}: no lane slot can take it: all {self.caps.max_lanes} are held ({len(held)} quarantined after a failed release: "
                f"{'; '.join(held.values())})",
            )
        why = request.params.check_for(request.sampling, top_k_limit=self.caps.top_k_limit)
        if why:
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"{name}: {why}")

    def add(self, request: Request, seq_id: int, arrival: Optional[float] = None, name: str = "request") -> Sequence:
        """Queue ``request`` as sequence (and lane) ``seq_id``; refused requests raise
        StatusError (its message names the request as ``name``)."""
        self.check(request, name)
        if seq_id in self.running or any(s.seq_id == seq_id for s in self.waiting):
            raise StatusError(Status.LANE_ALREADY_ADMITTED, f"add: sequence {seq_id} is already queued or running")
        prompt_id = self.executor.register_prompt(list(request.prompt_ids))
        decoder = self.tokenizer.stream(skip_special=True) if self.tokenizer is not None else None
        seq = Sequence(seq_id, request, len(request.prompt_ids), decoder, self.clock() if arrival is None else arrival)
        seq.prompt_id = prompt_id
        self.waiting.append(seq)
        return seq

    def abort(self, seq_id: int, error: Optional[str] = None) -> Optional[Update]:
        """End a waiting or running sequence now (``Finish.ABORTED``, or ``ERROR`` with
        ``error``); its lane is released. None when no such sequence is live."""
        finish = Finish.ABORTED if error is None else FINISH_ERROR
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                self._drop_prompt(seq)
                return seq.end(finish, self.clock(), error)
        seq = self.running.pop(seq_id, None)
        if seq is None:
            return None
        self._drop_prompt(seq)
        if seq_id in self.executor.lanes:
            self.executor.tick(Plan().release(seq_id))
        return seq.end(finish, self.clock(), error)

    def abort_all(self, error: Optional[str] = None) -> list[Update]:
        ids = [s.seq_id for s in self.waiting] + list(self.running)
        return [u for u in (self.abort(i, error) for i in ids) if u is not None]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ---------------------------------------------------------------------------------

    def slot_of(self, drafter: str) -> int:
        """The strategy slot of ``drafter`` (a :data:`DRAFTERS` name), registered on
        first use with this scheduler's configuration of its kind. One slot per kind:
        the lanes of a kind share what it keeps across requests (the suffix corpus)."""
        kind = DRAFTERS[drafter]
        if kind not in self._slots:
            self._slots[kind], _ = self.executor.register_strategy(kind, strategy_id(kind), bytes(32), 0, self.draft_configs.get(kind))
        return self._slots[kind]

    def _slot(self, request: Request) -> int:
        return self.slot_of(request.drafter) if request.speculate else 0

    def _drop_prompt(self, seq: Sequence) -> None:
        if seq.prompt_id:
            self.executor.drop_prompt(seq.prompt_id)
            seq.prompt_id = 0

    def plan(self) -> Plan:
        """The next tick's plan (admissions happen in the scheduler's books at once)."""
        plan = Plan()
        now = self.clock()
        # Slots the fault-safe executor quarantined after a failed release hold no lane.
        room = self.caps.max_lanes - len(self.executor.quarantined)
        while self.waiting and len(self.running) < room:
            seq = self.waiting.popleft()
            r = seq.request
            plan.admit(seq.seq_id, seq.prompt_id, strategy_slot=self._slot(r), sampling=r.sampling, params=r.params,
                       rng_counter_base=r.seed, logprobs=r.logprobs, draft_scope=r.draft_scope)
            seq.admitted, seq.admitted_at = True, now
            self.running[seq.seq_id] = seq
        budget = self.prefill_budget
        decoding = []
        for seq in self.running.values():
            left = seq.prompt_len - seq.prefilled_len
            if left and (budget is None or budget > 0):
                n = min(self.prefill_chunk, left, budget if budget is not None else left)
                plan.prefill(seq.seq_id, seq.prefilled_len, n)
                seq.prefilled_len += n
                if budget is not None:
                    budget -= n
            if seq.decoding:
                decoding.append(seq)
        asks = self.policy.plan(decoding, self.tick_tokens)
        for seq in decoding:
            n, max_draft = asks.get(seq.seq_id, (self.tick_tokens, None))
            cap = seq.request.max_draft  # the request's own cap (0: none) within the policy's
            if cap and max_draft != 0:
                max_draft = cap if max_draft is None else min(cap, max_draft)
            seq.may_draft = seq.request.speculate and max_draft != 0
            plan.decode(seq.seq_id, n, max_draft=max_draft)
        return plan

    def step(self) -> list[Update]:
        """Plan, tick, apply; the updates of every sequence that changed.

        A tick that raises anything but a refusal of the plan (a backend fault the
        executor did not contain) fails the sequences of that tick with an error and
        releases their lanes; nothing is rebuilt. A refused plan (a bug here) does
        the same with the refusal's message.
        """
        plan = self.plan()
        if not plan.ops:
            return self._stalled()
        in_plan = list(dict.fromkeys(op.lane for op in plan.ops))
        try:
            events = self.executor.tick(plan)
        except Exception as exc:  # noqa: BLE001 - reported to the requests, and re-raised by the loop if release fails
            error = f"tick failed: {type(exc).__name__}: {exc}"
            return [u for u in (self.abort(lane, error) for lane in in_plan) if u is not None]
        for seq in self.running.values():
            if seq.admitted_at is not None:
                self._drop_prompt(seq)  # the lane holds its own copy once admitted
        return self._apply(events)

    def retry_quarantined(self) -> None:
        """Release the slots quarantined after a failed release again (an empty tick does)."""
        if self.executor.quarantined:
            self.executor.tick(Plan())

    def _stalled(self) -> list[Update]:
        """Nothing could be planned: when sequences wait while every lane slot is
        quarantined, retry the releases; if every slot stays quarantined, the waiting
        sequences end with why (they would wait for ever)."""
        if not self.waiting or self.running or not self.executor.quarantined:
            return []
        self.retry_quarantined()
        held = self.executor.quarantined
        if len(held) < self.caps.max_lanes:
            return []
        why = f"scheduler: every lane slot is quarantined after a failed release ({'; '.join(held.values())})"
        return [u for u in (self.abort(s.seq_id, why) for s in list(self.waiting)) if u is not None]

    def _apply(self, events: Events) -> list[Update]:
        now = self.clock()
        updates, stopped = [], []
        for emit in events:
            seq = self.running.get(emit.lane)
            if seq is None:
                continue
            new = self.executor.read_tokens(emit.token_ref)
            update = seq.apply(emit, new, now)
            if emit.finish != Finish.NONE:
                del self.running[emit.lane]  # the executor released the lane
            elif update.finished:
                stopped.append(emit.lane)
            if update.tokens or update.text or update.finished:
                updates.append(update)
        if stopped:  # a stop ended these: free their lanes now, not a tick later
            plan = Plan()
            for lane in stopped:
                plan.release(lane)
                del self.running[lane]
            self.executor.tick(plan)
        return updates


def run_to_completion(scheduler: Scheduler, on_update: Optional[Callable[[Update], None]] = None) -> None:
    """Step until nothing is waiting or running."""
    while scheduler.has_work:
        for update in scheduler.step():
            if on_update is not None:
                on_update(update)
