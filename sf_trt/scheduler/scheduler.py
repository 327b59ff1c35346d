"""The scheduler: one :meth:`Scheduler.step` plans, ticks, applies and releases
(the package docstring, :mod:`sf_trt.scheduler`)."""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Optional

from ..abi import Finish, Status, StatusError
from ..engine import Events, Plan
from ..executor import Executor, check_draft_scope
from .config import SchedulerConfig
from .requests import DRAFTERS, Request, strategy_id
from .sequence import Sequence, Update

__all__ = ["Scheduler"]


class Scheduler:
    """Admits, prefills, decodes and releases sequences on one Executor (module docstring).

    ``config`` says how (:class:`~sf_trt.scheduler.config.SchedulerConfig`). Not
    thread-safe: one thread calls every method (the engine loop's, or the
    Generator's caller). ``tokenizer`` (anything with ``stream(skip_special=...)``)
    is needed for text and stop strings.
    """

    def __init__(
        self,
        executor: Executor,
        config: SchedulerConfig = SchedulerConfig(),
        *,
        tokenizer: Any = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.executor = executor
        self.caps = executor.caps
        self.config = config
        self.policy = config.policy
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
        if request.prompt_logprobs is not None and not self.caps.verify_rows:
            raise StatusError(Status.UNSUPPORTED, f"{name}: prompt_logprobs needs a backend with logit rows at every position (verify rows)")
        why = request.params.check_for(request.sampling, top_k_limit=self.caps.top_k_limit, vocab=self.caps.vocab)
        if why:
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"{name}: {why}")

    def add(self, request: Request, seq_id: int, arrival: Optional[float] = None, name: str = "request", *,
            checked: bool = False) -> Sequence:
        """Queue ``request`` as sequence (and lane) ``seq_id``; refused requests raise
        StatusError (its message names the request as ``name``). ``checked``: the caller
        ran :meth:`check` on it already (the engine loop's door), so it is not run twice."""
        if not checked:
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
        finish = Finish.ABORTED if error is None else Finish.ERROR
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
            self._slots[kind], _ = self.executor.register_strategy(kind, strategy_id(kind), bytes(32), 0, self.config.draft_configs.get(kind))
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
            # start from the longest prefix the cache holds for the request's scope; prefill the rest
            # (all of it for prompt logprobs, which score every prompt position in the prefill)
            if self.executor.prefix_cache is not None:
                held = 0 if r.prompt_logprobs is not None else self.executor.cached_prefix(seq.prompt_id, r.draft_scope)
                seq.cached_len = seq.prefilled_len = held
            plan.admit(seq.seq_id, seq.prompt_id, strategy_slot=self._slot(r), sampling=r.sampling, params=r.params,
                       rng_counter_base=r.seed, logprobs=r.logprobs, draft_scope=r.draft_scope, cached_len=seq.prefilled_len,
                       prompt_logprobs=r.prompt_logprobs)
            seq.admitted, seq.admitted_at = True, now
            self.running[seq.seq_id] = seq
        budget = self.config.prefill_budget
        decoding = []
        for seq in self.running.values():
            left = seq.prompt_len - seq.prefilled_len
            if left and (budget is None or budget > 0):
                n = min(self.config.prefill_chunk, left, budget if budget is not None else left)
                plan.prefill(seq.seq_id, seq.prefilled_len, n)
                seq.prefilled_len += n
                if budget is not None:
                    budget -= n
            if seq.decoding and seq.request.prompt_only:
                plan.release(seq.seq_id)  # scored: the prefill's emit carries the prompt logprobs
            elif seq.decoding:
                decoding.append(seq)
        if self.config.first_token_tick and any(seq.first_token_at is None for seq in decoding):
            # a first token is due: a tick of one pass without drafts, so it streams as soon as it is
            # drawn, not after the tick_tokens passes of the tick its prompt's prefill ended in
            for seq in decoding:
                seq.may_draft = False
                plan.decode(seq.seq_id, 1, max_draft=0)
            return plan
        asks = self.policy.plan(decoding, self.config.tick_tokens)
        for seq in decoding:
            n, max_draft = asks.get(seq.seq_id, (self.config.tick_tokens, None))
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
