"""The Executor: runs plan ticks on primitives, with exact speculation by any drafter.

A tick reads like the design::

    check(plan)            the whole plan against the lanes, before anything runs
    admit / prefill        slots taken (a lane may start from a prefix the prefix
                           cache holds: ``Admit.cached_len``); prompt chunks forwarded
                           in packed passes, the completed blocks offered to the cache
    decode steps           each step: one forward over every decoding lane's rows,
                           one verify-and-sample pass, accept, roll back
    emit / release         one emit per lane touched; finished lanes freed

State model ("pending token"): a lane's tokens are its prompt then what it
emitted; the last one is *pending*: drawn (or the last prompt token) but not yet
forwarded, so the backend's state holds ``len(tokens) - 1`` positions once the
prompt is prefilled. A decode step forwards the pending token plus a draft as
rows; row ``i`` draws the token at position ``pending + i + 1``.

Accept and roll back, one lane, draft of k = 4, the first 2 taken::

    positions   p      p+1    p+2    p+3    p+4
    rows        tok    d0     d1     d2     d3        forwarded this step
    drawn       t0     t1     t2     t3     t4        t_i drawn at position p+i+1
    match       t0=d0  t1=d1  t2!=d2                  a = 2 leading matches
    emitted     d0     d1     t2                      a + 1 tokens (t0=d0, t1=d1)
    state       [committed.....]|[rejected.....]
                p .. p+a  (= p+2) | p+3, p+4: dead, truncate(slot, p + a + 1)

The token at each position is drawn from the same logits row (rows are
bit-identical however a pass is packed) with the same RNG key (the lane's
``rng_counter_base`` and the position) and the same logit adjustments (penalties,
bias, ``min_tokens``, a grammar's mask: from the tokens before the position, draft
tokens included; :mod:`sf_trt.penalties`), so a step emits exactly what the same number of plain
steps would have emitted.

Backend faults. A refused plan raises :class:`StatusError` before anything runs
and changes nothing. Once a plan is accepted, ``tick`` does not raise for what
the backend does: every primitive call goes through :meth:`Executor._call`, and
when one raises, the lanes it served end with ``Finish.ERROR`` and ``Emit.error``
``"<op> (lanes 1, 4): <type>: <message>"``, the op being one of::

    prefill forward    the lanes with rows in the failed pass (their rows in later
                       prefill passes are dropped; other lanes' prefill goes on)
    decode forward     every lane of the step (they share the pass)
    verify_sample      every lane of the step
    truncate           that lane only (the step's other lanes go on)
    prefix load/save   that lane only (the prefix cache copying its state in or out)
    release            that lane's slot is quarantined, see below

Every token drawn before the fault, in earlier steps of the tick or in the same
step before a failed truncate, is in the lane's emit. Lanes outside the failed
pass are untouched and keep decoding in the same tick: a fault never changes
another lane's tokens. A logits row ``verify_sample`` cannot sample from (NaN,
+inf, all -inf, overflowing at the temperature: a
:class:`~sf_trt.primitives.RowFault`) ends its lane alone, with the tokens before
that row emitted, unless the lane ended (EOS, length) before it.

A lane that ends, by finishing or by a fault, is released in the tick's last
phase (what it committed is offered to the prefix cache first, unless it
failed). If the release raises, the lane still ends as it would have (its finish
stays, ``Emit.error`` reports the release) and its id is free again, but its
slot is *quarantined*: not reused, released again at the end of every later
tick until that succeeds (``Executor.quarantined``). ``check_integrity`` holds
throughout: the slots in use, free and quarantined partition the backend's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from .abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from .drafting import Drafter
from .engine import TOP_LOGPROBS_MAX, Admit, Decode, Emit, Events, Plan, Prefill, Release, SpecCounts, TokenLogprobs, TokenRef, TokenRing
from .penalties import LanePenalties, pack
from .prefix_cache import BLOCK_TOKENS, CachedBlock, PrefixCache
from .primitives import Capabilities, PrimitivesBase, RowFault, Rows, SampleRows
from .strategies import Certificate, Grant, make_grant

__all__ = ["Executor", "ExecutorConfig", "check_prompt", "check_draft_scope"]

_U32 = 2**32
_I63 = 2**63
MAX_SCOPE_CHARS = 1024
_FAULT = object()
"""What :meth:`Executor._call` returns when the primitive raised."""


def _is_int(value: Any) -> bool:
    """An int or numpy integer, and not a bool (True is not lane 1)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_draft_scope(scope: Any, name: str) -> None:
    """Refuse (``BAD_ARGUMENT``, the message starting with ``name``) a draft scope that is
    neither None nor a str of at most :data:`MAX_SCOPE_CHARS` characters."""
    if scope is not None and (not isinstance(scope, str) or len(scope) > MAX_SCOPE_CHARS):
        got = f"a str of {len(scope)} characters" if isinstance(scope, str) else type(scope).__name__
        raise StatusError(Status.BAD_ARGUMENT, f"{name}: draft_scope must be None or a str of at most {MAX_SCOPE_CHARS} characters (got {got})")


def check_prompt(tokens: Any, caps: Capabilities) -> np.ndarray:
    """``tokens`` as a read-only int64 array, or the StatusError :meth:`Executor.register_prompt`
    raises for them (callers on other threads check a prompt before handing it over)."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise StatusError(Status.BAD_ARGUMENT, f"prompt: tokens must be a 1-D sequence of ints (got dtype {arr.dtype}, shape {arr.shape})")
    if not isinstance(tokens, np.ndarray):  # numpy reads [1, True] as ints
        flag = next((i for i, t in enumerate(tokens) if isinstance(t, (bool, np.bool_))), None)
        if flag is not None:
            raise StatusError(Status.BAD_ARGUMENT, f"prompt: the token at index {flag} is a bool, not a token id")
    if arr.size == 0:
        raise StatusError(Status.EMPTY_PROMPT, "prompt: no tokens (a lane needs at least one)")
    bad = np.flatnonzero((arr < 0) | (arr >= caps.vocab))
    if bad.size:
        i = int(bad[0])
        raise StatusError(
            Status.TOKEN_OUT_OF_VOCAB,
            f"prompt: token {int(arr[i])} at index {i} is outside the vocabulary 0..{caps.vocab - 1}",
        )
    if arr.size > caps.max_context - 1:
        raise StatusError(
            Status.PROMPT_TOO_LONG,
            f"prompt: {arr.size} tokens leave no room to generate in a context of {caps.max_context}",
        )
    prompt = arr.astype(np.int64)
    prompt.setflags(write=False)
    return prompt


@dataclasses.dataclass(frozen=True)
class ExecutorConfig:
    """How the executor runs its ticks.

    ``ring_capacity``: tokens each lane's output ring holds (and the most one
    ``decode`` may ask for). ``max_prefill_rows``: rows per prefill pass (None:
    the backend's ``max_rows_per_pass``). ``prefix_cache_mb``: MiB of the prefix
    cache (:mod:`sf_trt.prefix_cache`; the backend allocates its block pool once at
    this size; 0: none, the bare executor's default; the command line and the server
    default to ``DEFAULT_PREFIX_CACHE_MB``).
    """

    ring_capacity: int = 4096
    max_prefill_rows: Optional[int] = None
    prefix_cache_mb: int = 0

    def __post_init__(self) -> None:
        for name in ("ring_capacity", "max_prefill_rows", "prefix_cache_mb"):
            value = getattr(self, name)
            if not _is_int(value) and not (name == "max_prefill_rows" and value is None):
                raise StatusError(Status.BAD_ARGUMENT, f"ExecutorConfig: {name} must be an int (got {value!r})")
        if self.prefix_cache_mb < 0:
            raise StatusError(Status.BAD_ARGUMENT, f"ExecutorConfig: prefix_cache_mb must be >= 0 (got {self.prefix_cache_mb})")
        if self.ring_capacity < 1:
            raise StatusError(Status.BAD_ARGUMENT, f"ExecutorConfig: ring_capacity must be >= 1 (got {self.ring_capacity})")
        if self.max_prefill_rows is not None and self.max_prefill_rows < 1:
            raise StatusError(Status.BAD_ARGUMENT, f"ExecutorConfig: max_prefill_rows must be >= 1 (got {self.max_prefill_rows})")


@dataclasses.dataclass(eq=False)
class _Lane:
    """One admitted lane. Invariant: the backend holds ``committed_len`` positions."""

    lane_id: int
    slot: int
    prompt_len: int
    sampling: Sampling
    params: SamplingParams
    rng_counter_base: int
    grant: Optional[Grant]
    drafter: Optional[Drafter]
    tokens: list[int]
    prefilled_len: int = 0
    finish: Finish = Finish.NONE
    error: Optional[str] = None
    """What failed for this lane in the current tick (see ``Emit.error``)."""
    logprobs: Optional[int] = None
    scope: Optional[str] = None
    """The tenant scope (``Admit.draft_scope``): whose cached prefixes the lane shares."""
    prefix: list[CachedBlock] = dataclasses.field(default_factory=list)
    """The chain of cached blocks holding the lane's first positions, pinned while it lives."""
    penalties: Optional[LanePenalties] = None
    """The lane's logit-adjustment books; None when its params adjust nothing."""
    prompt_logprobs: Optional[int] = None
    """Alternatives per prompt token its prefill reports (None: no prompt logprobs)."""

    @property
    def emitted_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def decoding(self) -> bool:
        return self.prefilled_len == self.prompt_len

    @property
    def committed_len(self) -> int:
        """Positions the backend's state holds: everything but the pending token."""
        return min(self.prefilled_len, self.prompt_len - 1) + self.emitted_len


@dataclasses.dataclass
class _Checked:
    """A plan that passed the check, sorted into the tick's phases."""

    admits: list[Admit]
    prefills: list[Prefill]
    decodes: dict[int, int]
    releases: list[int]
    touched: list[int]
    max_drafts: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _TickOut:
    """What each lane produced during the tick."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    passes: int = 0
    drafts: int = 0
    max_draft: Optional[int] = None
    logprobs: list[TokenLogprobs] = dataclasses.field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] = dataclasses.field(default_factory=list)


class Executor:
    """Runs plan ticks on a :class:`~sf_trt.primitives.PrimitivesBase` backend."""

    def __init__(self, primitives: PrimitivesBase, config: ExecutorConfig = ExecutorConfig()) -> None:
        caps = primitives.capabilities
        if caps.max_rows_per_pass < caps.max_lanes:
            raise StatusError(
                Status.BAD_ARGUMENT,
                f"Executor: the backend's max_rows_per_pass {caps.max_rows_per_pass} is below its max_lanes {caps.max_lanes}",
            )
        self.primitives = primitives
        self.config = config
        self.caps = caps
        self._lanes: dict[int, _Lane] = {}
        self._free_slots: list[int] = list(range(caps.max_lanes - 1, -1, -1))
        self._rings = [TokenRing(slot, config.ring_capacity) for slot in range(caps.max_lanes)]
        self._prompts: dict[int, np.ndarray] = {}
        self._next_prompt = 1
        self._grants: dict[int, Grant] = {}
        self._quarantined: dict[int, str] = {}  # slot -> why its release failed
        self._prefill_rows = min(config.max_prefill_rows or caps.max_rows_per_pass, caps.max_rows_per_pass)
        self.grammar_cut_tokens = 0
        """Draft tokens cut before their pass because the lane's grammar forbids them (all lanes, ever)."""
        self.prefix_cache: Optional[PrefixCache] = None
        if config.prefix_cache_mb:
            if caps.state_bytes_per_token <= 0:
                raise StatusError(
                    Status.UNSUPPORTED,
                    f"Executor: prefix_cache_mb {config.prefix_cache_mb} asks for a prefix cache, and {type(primitives).__name__} "
                    "cannot save or load state (use prefix_cache_mb=0)",
                )
            budget = config.prefix_cache_mb << 20
            self.prefix_cache = PrefixCache(primitives.open_block_pool(budget, BLOCK_TOKENS), budget)
        self.prefix_queries = 0
        """Prompt tokens of lanes admitted while the prefix cache was on (vLLM's prefix_cache_queries)."""
        self.prefix_hits = 0
        """Of those, the tokens taken from the cache (vLLM's prefix_cache_hits)."""

    # -- registration and prompts ---------------------------------------------------

    def register_strategy(
        self,
        kind: str,
        strategy_id: bytes,
        config_digest: bytes,
        kernel_capability: int = 0,
        config: Any = None,
    ) -> tuple[int, list[Certificate]]:
        """Register a speculation strategy; ``(slot, certificates)`` or REGISTRATION_REFUSED."""
        for grant in self._grants.values():
            if (grant.kind.name, grant.strategy_id, grant.config_digest, grant.kernel_capability) == (
                kind, bytes(strategy_id), bytes(config_digest), kernel_capability,
            ) and (config is None or config == grant.config):
                return grant.slot, list(grant.certs)
        grant = make_grant(len(self._grants) + 1, kind, self.caps, strategy_id, config_digest, kernel_capability, config)
        self._grants[grant.slot] = grant
        return grant.slot, list(grant.certs)

    def shared_state(self, slot: int) -> Any:
        """What the lanes of a granted slot share (the suffix drafter's corpus), or None."""
        if slot not in self._grants:
            raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, f"shared_state({slot!r}): slot never granted (granted: {sorted(self._grants)})")
        return self._grants[slot].shared

    def register_prompt(self, tokens: Any) -> int:
        """Store a prompt; its id is what ``Plan.admit`` takes."""
        prompt = check_prompt(tokens, self.caps)
        pid = self._next_prompt
        self._next_prompt += 1
        self._prompts[pid] = prompt
        return pid

    def drop_prompt(self, prompt_id: int) -> None:
        """Forget a stored prompt (lanes already admitted with it keep their copy)."""
        if not _is_int(prompt_id):
            raise StatusError(Status.BAD_ARGUMENT, f"drop_prompt({prompt_id!r}): prompt ids are ints")
        if self._prompts.pop(prompt_id, None) is None:
            raise StatusError(Status.UNKNOWN_PROMPT, f"drop_prompt({prompt_id}): no such prompt")

    def cached_prefix(self, prompt_id: int, scope: Optional[str]) -> int:
        """How many of prompt ``prompt_id``'s first positions a lane of ``scope`` admitted
        now could take from the prefix cache (``Admit.cached_len``): whole blocks, at
        most all but the last prompt token (whose row a decode computes). 0 when the
        cache is off, the scope is private (None) or nothing matches."""
        if not _is_int(prompt_id) or prompt_id not in self._prompts:
            raise StatusError(Status.UNKNOWN_PROMPT, f"cached_prefix({prompt_id!r}): no such prompt")
        if self.prefix_cache is None:
            return 0
        prompt = self._prompts[prompt_id]
        return self.prefix_cache.cached_len(scope, prompt.tolist(), prompt.shape[0] - 1)

    def read_tokens(self, ref: TokenRef) -> list[int]:
        """The tokens behind an emit's ``token_ref``."""
        if not 0 <= ref.ring < len(self._rings):
            raise StatusError(Status.BAD_ARGUMENT, f"read_tokens: no ring {ref.ring} (rings 0..{len(self._rings) - 1})")
        return self._rings[ref.ring].read(ref)

    @property
    def lanes(self) -> list[int]:
        """Ids of the admitted lanes."""
        return sorted(self._lanes)

    def lane_tokens(self, lane: int) -> list[int]:
        """A live lane's prompt and emitted tokens."""
        if not _is_int(lane) or lane not in self._lanes:
            raise StatusError(Status.UNKNOWN_LANE, f"lane_tokens(lane={lane}): lane not admitted (admitted: {self.lanes})")
        return list(self._lanes[lane].tokens)

    # -- the tick ---------------------------------------------------------------------

    @property
    def quarantined(self) -> dict[int, str]:
        """Slots whose release failed, with why; each is released again after every tick."""
        return dict(self._quarantined)

    def check(self, plan: Plan) -> None:
        """Check ``plan`` as :meth:`tick` would, without running it: raises the
        :class:`StatusError` that ``tick`` would raise, else returns."""
        self._check(plan)

    def tick(self, plan: Plan) -> Events:
        """Run one plan. Refused plans raise :class:`StatusError` and change nothing;
        backend faults end the lanes they hit with ``Finish.ERROR`` (module docstring)."""
        checked = self._check(plan)
        out = {lane: _TickOut(max_draft=checked.max_drafts.get(lane)) for lane in checked.touched}
        for op in checked.admits:
            self._admit(op)
        self._prefill(checked.prefills, out)
        self._decode({self._lanes[lane]: n for lane, n in checked.decodes.items()}, out)
        for lane in checked.releases:
            if self._lanes[lane].finish == Finish.NONE:
                self._lanes[lane].finish = Finish.ABORTED
        return self._emit_and_release(checked.touched, out)

    def _call(self, op: str, lanes: list[_Lane], primitive: Callable[..., Any], *args: Any) -> Any:
        """``primitive(*args)`` for ``lanes``, or :data:`_FAULT` when it raised: the
        one place a backend fault is caught. The lanes end with ``Finish.ERROR``
        (or keep the finish they already had) and the error naming ``op``."""
        try:
            return primitive(*args)
        except Exception as exc:  # any backend fault ends these lanes, never the tick
            ids = sorted(lane.lane_id for lane in lanes)
            who = f"lane {ids[0]}" if len(ids) == 1 else f"lanes {', '.join(map(str, ids))}"
            self._fail(lanes, f"{op} ({who}): {type(exc).__name__}: {exc}")
            return _FAULT

    @staticmethod
    def _fail(lanes: list[_Lane], message: str) -> None:
        for lane in lanes:
            lane.error = message if lane.error is None else f"{lane.error}; then {message}"
            if lane.finish == Finish.NONE:
                lane.finish = Finish.ERROR

    # -- check: the whole plan, before anything runs ---------------------------------------

    def _check(self, plan: Plan) -> _Checked:
        if not isinstance(plan, Plan):
            raise StatusError(Status.BAD_ARGUMENT, f"tick: expected a Plan (got {type(plan).__name__})")
        # Shadow of each lane the plan touches: [prompt_len, prefilled_len, decoded, released].
        shadow: dict[int, list] = {}
        checked = _Checked([], [], {}, [], [])
        free = len(self._free_slots)

        def lane_of(op_name: str, lane: Any) -> list:
            if not _is_int(lane) or not 0 <= lane < _U32:
                raise StatusError(Status.BAD_ARGUMENT, f"{op_name}(lane={lane!r}): lane ids are ints in 0..2**32-1")
            lane = int(lane)
            if lane not in shadow:
                live = self._lanes.get(lane)
                if live is None:
                    raise StatusError(Status.UNKNOWN_LANE, f"{op_name}(lane={lane}): lane not admitted (admitted: {self.lanes})")
                shadow[lane] = [live.prompt_len, live.prefilled_len, False, False]
                checked.touched.append(lane)
            s = shadow[lane]
            if s[3]:
                raise StatusError(Status.DUPLICATE_OP, f"{op_name}(lane={lane}): the lane was released earlier in this plan")
            return s

        for op in plan.ops:
            if isinstance(op, Admit):
                free -= 1
                self._check_admit(op, shadow, free)
                shadow[int(op.lane)] = [len(self._prompts[op.prompt]), int(op.cached_len), False, False]
                checked.touched.append(int(op.lane))
                checked.admits.append(op)
            elif isinstance(op, Prefill):
                s = lane_of("prefill", op.lane)
                name = f"prefill(lane={op.lane}, start={op.start}, length={op.length})"
                if not _is_int(op.start) or not _is_int(op.length) or op.length < 1:
                    raise StatusError(Status.PREFILL_OUT_OF_RANGE, f"{name}: start and length must be ints, length >= 1")
                if op.start != s[1]:
                    raise StatusError(Status.PREFILL_OUT_OF_ORDER, f"{name}: the lane has {s[1]} prompt tokens prefilled, the next chunk starts there")
                if op.start + op.length > s[0]:
                    raise StatusError(Status.PREFILL_OUT_OF_RANGE, f"{name}: past the prompt's {s[0]} tokens")
                s[1] += int(op.length)
                checked.prefills.append(Prefill(int(op.lane), int(op.start), int(op.length)))
            elif isinstance(op, Decode):
                s = lane_of("decode", op.lane)
                name = f"decode(lane={op.lane}, n={op.n})"
                if s[2]:
                    raise StatusError(Status.DUPLICATE_OP, f"{name}: the lane already decodes in this plan")
                if s[1] != s[0]:
                    raise StatusError(Status.DECODE_BEFORE_PREFILL, f"{name}: {s[1]} of the prompt's {s[0]} tokens prefilled")
                if not _is_int(op.n) or not 1 <= op.n <= self.config.ring_capacity:
                    raise StatusError(Status.DECODE_OUT_OF_RANGE, f"{name}: n must be in 1..{self.config.ring_capacity} (the ring's capacity)")
                md = op.max_draft
                if md is not None and (not _is_int(md) or md < 0):
                    raise StatusError(Status.BAD_ARGUMENT, f"{name}: max_draft must be None or an int >= 0 (got {md!r})")
                s[2] = True
                checked.decodes[int(op.lane)] = int(op.n)
                if md is not None:
                    checked.max_drafts[int(op.lane)] = int(md)
            elif isinstance(op, Release):
                s = lane_of("release", op.lane)
                s[3] = True
                checked.releases.append(int(op.lane))
            else:
                raise StatusError(Status.BAD_ARGUMENT, f"tick: unknown op {op!r}")
        return checked

    def _check_admit(self, op: Admit, shadow: dict, free_after: int) -> None:
        name = f"admit(lane={op.lane!r})"
        if not _is_int(op.lane) or not 0 <= op.lane < _U32:
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: lane ids are ints in 0..2**32-1")
        if op.lane in self._lanes or op.lane in shadow:
            raise StatusError(Status.LANE_ALREADY_ADMITTED, f"{name}: the lane is already admitted")
        if not _is_int(op.prompt):
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: prompt ids are ints (got {op.prompt!r})")
        if op.prompt not in self._prompts:
            raise StatusError(Status.UNKNOWN_PROMPT, f"{name}: unknown prompt {op.prompt!r} (register it with prompt() first)")
        if not _is_int(op.strategy_slot):
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: strategy_slot is an int, 0 for none (got {op.strategy_slot!r})")
        if op.strategy_slot != 0:
            grant = self._grants.get(op.strategy_slot)
            if grant is None:
                raise StatusError(
                    Status.REJECT_ILLEGAL_COMBINATION,
                    f"{name}: strategy slot {op.strategy_slot!r} was never granted (granted: {sorted(self._grants)})",
                )
        try:
            if not _is_int(op.sampling):
                raise ValueError(op.sampling)
            mode = Sampling(op.sampling)
        except ValueError:
            raise StatusError(Status.BAD_SAMPLING_MODE, f"{name}: unknown sampling mode {op.sampling!r} (known: {[m.name for m in Sampling]})") from None
        if op.strategy_slot != 0 and not self._grants[op.strategy_slot].covers(mode):
            raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, f"{name}: strategy slot {op.strategy_slot} is not certified for {mode.name}")
        if not isinstance(op.params, SamplingParams):
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"{name}: params must be a SamplingParams (got {type(op.params).__name__})")
        why = op.params.check_for(mode, top_k_limit=self.caps.top_k_limit, vocab=self.caps.vocab)
        if why:
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"{name}: {why}")
        base = op.rng_counter_base
        if not _is_int(base) or not 0 <= base < _I63:
            raise StatusError(Status.BAD_SAMPLING_PARAMS, f"{name}: rng_counter_base must be an int in 0..2**63-1 (got {base!r})")
        lp = op.logprobs
        if lp is not None and (not _is_int(lp) or not 0 <= lp <= TOP_LOGPROBS_MAX):
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: logprobs must be None or an int in 0..{TOP_LOGPROBS_MAX} (got {lp!r})")
        if lp is not None and not self.caps.logprobs:
            raise StatusError(Status.UNSUPPORTED, f"{name}: this backend does not report logprobs (asked for {lp})")
        plp = op.prompt_logprobs
        if plp is not None and (not _is_int(plp) or not 0 <= plp <= TOP_LOGPROBS_MAX):
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: prompt_logprobs must be None or an int in 0..{TOP_LOGPROBS_MAX} (got {plp!r})")
        if plp is not None and not self.caps.verify_rows:
            raise StatusError(Status.UNSUPPORTED, f"{name}: prompt_logprobs needs logit rows at every prefill position (this backend has no verify rows)")
        if plp is not None and not self.caps.logprobs:
            raise StatusError(Status.UNSUPPORTED, f"{name}: this backend does not report logprobs (asked for prompt_logprobs {plp})")
        check_draft_scope(op.draft_scope, name)
        cached = op.cached_len
        if not _is_int(cached) or cached < 0:
            raise StatusError(Status.BAD_ARGUMENT, f"{name}: cached_len must be an int >= 0 (got {cached!r})")
        if cached and plp is not None:
            raise StatusError(
                Status.BAD_ARGUMENT,
                f"{name}: prompt_logprobs {plp} scores every prompt position in the prefill, and cached_len {cached} skips "
                "the first of them (admit it with cached_len=0)",
            )
        if cached:
            held = self.cached_prefix(op.prompt, op.draft_scope)
            if cached > held or cached % self.prefix_cache.block_tokens:
                raise StatusError(Status.PREFIX_NOT_CACHED, f"{name}: cached_len {cached}, and the prefix cache holds {held} positions of the prompt for its scope (whole blocks)")
        if free_after < 0:
            held = f" ({len(self._quarantined)} quarantined after a failed release)" if self._quarantined else ""
            raise StatusError(Status.CAPACITY_EXHAUSTED, f"{name}: all {self.caps.max_lanes} lane slots are in use{held}")

    # -- admit and prefill -------------------------------------------------------------------

    def _admit(self, op: Admit) -> None:
        prompt = self._prompts[op.prompt]
        grant = self._grants.get(op.strategy_slot) if op.strategy_slot else None
        tokens = prompt.tolist()
        drafter = grant.new_drafter(tokens, op.draft_scope) if grant is not None else None
        slot = self._free_slots.pop()
        lane = self._lanes[int(op.lane)] = _Lane(
            lane_id=int(op.lane), slot=slot, prompt_len=len(tokens), sampling=Sampling(op.sampling),
            params=op.params, rng_counter_base=int(op.rng_counter_base), grant=grant, drafter=drafter, tokens=tokens,
            logprobs=None if op.logprobs is None else int(op.logprobs), scope=op.draft_scope,
            penalties=LanePenalties(op.params, tokens, self.caps.eos) if op.params.adjusts_logits else None,
            prompt_logprobs=None if op.prompt_logprobs is None else int(op.prompt_logprobs),
        )
        cache = self.prefix_cache
        if cache is None:
            return
        self.prefix_queries += lane.prompt_len
        if op.cached_len:
            lane.prefix = cache.match(lane.scope, tokens, op.cached_len)  # the check saw them: nothing was evicted since
            cache.pin(lane.prefix)
            lane.prefilled_len = op.cached_len
            if self._call("prefix load", [lane], self.primitives.load_prefix, slot, [b.index for b in lane.prefix]) is not _FAULT:
                self.prefix_hits += op.cached_len

    def _save_prefix(self, lane: _Lane, length: int) -> None:
        """Offer the lane's first ``length`` positions (whole blocks) to the prefix cache."""
        if self.prefix_cache is None or lane.error is not None:
            return

        def save(start: int, index: int) -> bool:
            return self._call("prefix save", [lane], self.primitives.save_block, lane.slot, start, index) is not _FAULT

        lane.prefix = self.prefix_cache.extend(lane.scope, lane.prefix, lane.tokens, length, save)

    def _prefill(self, prefills: list[Prefill], out: dict[int, _TickOut]) -> None:
        """Forward the prompt chunks (all but each prompt's last token) in packed passes.

        A pass that faults ends the lanes with rows in it; their rows in later
        passes are dropped, the other lanes' rows still go. The rows of lanes that
        report prompt logprobs return logits: the row at position j scores prompt
        token j + 1 (:meth:`_prompt_logprobs`)."""
        if not prefills:
            return
        slots, positions, tokens = [], [], []
        by_slot: dict[int, _Lane] = {}
        for op in prefills:
            lane = self._lanes[op.lane]
            if lane.finish != Finish.NONE:  # its prefix load failed: it has ended
                continue
            by_slot[lane.slot] = lane
            end = min(op.start + op.length, lane.prompt_len - 1)
            if end > op.start:
                slots.append(np.full(end - op.start, lane.slot, np.int64))
                positions.append(np.arange(op.start, end, dtype=np.int64))
                tokens.append(np.asarray(lane.tokens[op.start:end], np.int64))
            lane.prefilled_len = op.start + op.length
        if not slots:
            return
        slots_all, pos_all, tok_all = (np.concatenate(a) for a in (slots, positions, tokens))
        scored = {slot for slot, lane in by_slot.items() if lane.prompt_logprobs is not None}
        no_logits = np.zeros(0, np.int64)
        n = self._prefill_rows
        while slots_all.size:
            wanted = np.flatnonzero(np.isin(slots_all[:n], list(scored))) if scored else no_logits
            rows = Rows(slots_all[:n], pos_all[:n], tok_all[:n], wanted)
            slots_all, pos_all, tok_all = slots_all[n:], pos_all[n:], tok_all[n:]
            lanes = [by_slot[slot] for slot in dict.fromkeys(rows.slots.tolist())]
            logits = self._call("prefill forward", lanes, self.primitives.forward, rows)
            if logits is _FAULT:
                left = ~np.isin(slots_all, rows.slots)
                slots_all, pos_all, tok_all = slots_all[left], pos_all[left], tok_all[left]
            elif wanted.size:
                self._prompt_logprobs(logits, rows, by_slot, out)
        for lane in by_slot.values():  # a running lane's prompt is a prefix others may start from
            self._save_prefix(lane, min(lane.prefilled_len, lane.prompt_len - 1))

    def _prompt_logprobs(self, logits: Any, rows: Rows, by_slot: dict[int, _Lane], out: dict[int, _TickOut]) -> None:
        """The logprobs of the prompt tokens a prefill pass's logit rows score: row
        ``rows.logit_rows[i]``, at position j of its lane, scores the lane's token j + 1."""
        slots, positions = rows.slots[rows.logit_rows], rows.positions[rows.logit_rows]
        lanes = [by_slot[slot] for slot in dict.fromkeys(slots.tolist())]
        nexts = np.fromiter((by_slot[s].tokens[p + 1] for s, p in zip(slots.tolist(), positions.tolist())), np.int64, slots.size)
        found = self._score(lanes, logits, np.arange(slots.size), nexts)
        if found is _FAULT:
            return
        lp, ids, top = found
        for lane in lanes:
            at = np.flatnonzero(slots == lane.slot)  # the lane's rows, in position order
            k = lane.prompt_logprobs
            out[lane.lane_id].prompt_logprobs.append(TokenLogprobs(lp[at], ids[at, :k], top[at, :k]))

    def _score(self, lanes: list[_Lane], logits: Any, rows: np.ndarray, tokens: np.ndarray) -> Any:
        """``(logprob, top ids, top logprobs)`` of ``tokens`` at logit rows ``rows`` (raw
        logits: the model's distribution; the backend's logprobs capability), or
        :data:`_FAULT` (the lanes end)."""
        return self._call("logprobs", lanes, self.primitives.logprobs, logits, rows, tokens)

    # -- decode ----------------------------------------------------------------------------------

    def _draft_limit(self, lane: _Lane, budget_left: int, max_draft: Optional[int]) -> int:
        """The most draft tokens a step may send: what the step could still emit, minus one,
        within the tick's ``max_draft`` for the lane."""
        limit = budget_left - 1 if max_draft is None else min(budget_left - 1, max_draft)
        if lane.params.max_tokens:
            limit = min(limit, lane.params.max_tokens - lane.emitted_len - 1)
        return min(limit, self.caps.max_context - len(lane.tokens) - 1, lane.drafter.draft_cap)

    def _decode(self, budgets: dict[_Lane, int], out: dict[int, _TickOut]) -> None:
        """Decode steps until every lane has its tokens or has finished."""
        rows_cap = self.caps.max_rows_per_pass
        while True:
            active = [
                (lane, n - len(out[lane.lane_id].tokens))
                for lane, n in budgets.items()
                if lane.finish == Finish.NONE and len(out[lane.lane_id].tokens) < n
            ]
            if not active:
                return
            spare_rows = rows_cap - len(active)
            drafts = []
            for lane, budget_left in active:
                draft: list[int] = []
                if lane.drafter is not None and spare_rows > 0:
                    draft = lane.drafter.propose(min(self._draft_limit(lane, budget_left, out[lane.lane_id].max_draft), spare_rows))
                    if lane.penalties is not None:  # a grammar cuts the draft at its first forbidden token
                        proposed = len(draft)
                        draft = lane.penalties.cut_draft(draft)
                        self.grammar_cut_tokens += proposed - len(draft)
                    spare_rows -= len(draft)
                drafts.append(draft)
            self._step([lane for lane, _ in active], drafts, out)

    def _step(self, lanes: list[_Lane], drafts: list[list[int]], out: dict[int, _TickOut]) -> None:
        """One packed forward + verify-and-sample pass, then accept and roll back per lane."""
        counts = np.fromiter((len(d) + 1 for d in drafts), np.int64, len(lanes))
        starts = np.fromiter((len(lane.tokens) - 1 for lane in lanes), np.int64, len(lanes))
        offsets = np.cumsum(counts) - counts
        num_rows = int(counts.sum())
        # positions[r]: where row r sits; row r draws the token at positions[r] + 1.
        positions = np.repeat(starts - offsets, counts) + np.arange(num_rows, dtype=np.int64)
        row_tokens = np.fromiter(
            (t for lane, d in zip(lanes, drafts) for t in (lane.tokens[-1], *d)), np.int64, num_rows
        )
        draft_at_row = np.fromiter((t for d in drafts for t in (*d, -1)), np.int64, num_rows)
        # Per-lane constants, one row per lane, repeated over the lane's rows.
        ints = np.repeat(np.array([(l.slot, int(l.sampling), l.params.top_k, l.rng_counter_base) for l in lanes], np.int64), counts, axis=0)
        floats = np.repeat(np.array([(l.params.temperature, l.params.top_p, l.params.min_p) for l in lanes], np.float32), counts, axis=0)
        rows = Rows(ints[:, 0], positions, row_tokens, np.arange(num_rows, dtype=np.int64))
        logits = self._call("decode forward", lanes, self.primitives.forward, rows)
        if logits is _FAULT:
            return
        # penalties, bias, min_tokens: row i of a lane adjusted by its tokens plus draft[:i] (sf_trt.penalties)
        adjusting = [(off, lane.penalties.rows(d)) for lane, d, off in zip(lanes, drafts, offsets.tolist()) if lane.penalties is not None]
        sample = SampleRows(
            mode=ints[:, 1], temperature=floats[:, 0], top_p=floats[:, 1], top_k=ints[:, 2], rng_counter_base=ints[:, 3],
            position=positions + 1, draft=draft_at_row, min_p=floats[:, 2],
            adjust=pack(adjusting) if adjusting else None,
        )
        verified = self._call("verify_sample", lanes, self.primitives.verify_sample, logits, sample)
        if verified is _FAULT:
            return
        drawn, match = verified
        wanted = []  # (lane, first logit row, tokens emitted) for lanes that report logprobs
        for lane, draft, off in zip(lanes, drafts, offsets.tolist()):
            n = self._accept(lane, draft, drawn[off : off + len(draft) + 1], match[off : off + len(draft)], out[lane.lane_id])
            if lane.logprobs is not None and n:
                wanted.append((lane, off, n))
        if wanted:
            self._logprobs(logits, drawn, wanted, out)

    def _logprobs(self, logits: Any, drawn: np.ndarray, wanted: list, out: dict[int, _TickOut]) -> None:
        """Each emitted token's logprob and top alternatives, from the rows that drew it."""
        rows = np.concatenate([np.arange(off, off + n) for _, off, n in wanted])
        found = self._score([lane for lane, _, _ in wanted], logits, rows, drawn[rows])
        if found is _FAULT:
            return
        lp, ids, top = found
        at = 0
        for lane, _, n in wanted:
            k = lane.logprobs
            out[lane.lane_id].logprobs.append(TokenLogprobs(lp[at : at + n], ids[at : at + n, :k], top[at : at + n, :k]))
            at += n

    def _accept(self, lane: _Lane, draft: list[int], drawn: np.ndarray, match: np.ndarray, out: _TickOut) -> int:
        """Emit the matching draft prefix plus the token drawn at the first mismatch
        (a row that could not be sampled from is a mismatch with no token: the lane
        ends there with ``Finish.ERROR``, unless it ended before that row); how many."""
        k = len(draft)
        accepted = k if match.all() else int(np.argmin(match))
        new = drawn[: accepted + 1].tolist()
        start = len(lane.tokens) - 1  # the pending token's position: the first row
        row_fault = RowFault(new.pop()) if new[-1] < 0 else None
        new, lane.finish = self._cut(lane, new)
        if row_fault is not None and lane.finish == Finish.NONE:
            self._fail([lane], f"verify_sample (lane {lane.lane_id}): the backend's logits for position {start + accepted + 1} {row_fault.describe()}")
        lane.tokens.extend(new)
        out.tokens.extend(new)
        if lane.penalties is not None:
            lane.penalties.extend(new)
        out.passes += 1
        if lane.drafter is not None:
            lane.drafter.extend(new)
            lane.drafter.observe(k, accepted)
        out.proposed += k
        out.accepted += min(accepted, len(new))
        out.drafts += k > 0
        if lane.finish == Finish.NONE and accepted < k:
            self._call("truncate", [lane], self.primitives.truncate, lane.slot, start + accepted + 1)
        return len(new)

    def _cut(self, lane: _Lane, new: list[int]) -> tuple[list[int], Finish]:
        """Cut a step's tokens at EOS, max_tokens or the context; the lane's finish."""
        if not lane.params.flags & SamplingFlag.IGNORE_EOS and self.caps.eos in new:
            return new[: new.index(self.caps.eos) + 1], Finish.EOS
        max_tokens = lane.params.max_tokens
        if max_tokens and lane.emitted_len + len(new) >= max_tokens:
            return new[: max_tokens - lane.emitted_len], Finish.LENGTH
        if len(lane.tokens) + len(new) >= self.caps.max_context:
            return new[: self.caps.max_context - len(lane.tokens)], Finish.CONTEXT
        return new, Finish.NONE

    # -- emit and release ---------------------------------------------------------------------

    def _emit_and_release(self, touched: list[int], out: dict[int, _TickOut]) -> Events:
        """One emit per lane touched; a lane that ended is released first, so that a
        failed release shows in its emit. Then the slots quarantined in earlier ticks
        are released again."""
        retry = list(self._quarantined)
        emits = {}
        for lane_id in touched:
            lane, o = self._lanes[lane_id], out[lane_id]
            if lane.finish != Finish.NONE:
                self._release(lane)
            ref = self._rings[lane.slot].write(o.tokens)
            logprobs = None if lane.logprobs is None else TokenLogprobs.concat(o.logprobs, lane.logprobs)
            prompt_lp = None if lane.prompt_logprobs is None else TokenLogprobs.concat(o.prompt_logprobs, lane.prompt_logprobs)
            emits[lane_id] = Emit(lane_id, ref, lane.finish, SpecCounts(o.proposed, o.accepted, o.drafts), o.passes, lane.error, logprobs, prompt_lp)
        for slot in retry:
            if self._call("release", [], self.primitives.release, slot) is not _FAULT:
                del self._quarantined[slot]
                self._free_slots.append(slot)
        return Events(emits)

    def _release(self, lane: _Lane) -> None:
        """Free the lane's id, and its slot unless the backend fails to release it. What it
        committed (prompt and output) is offered to the prefix cache first."""
        if self.prefix_cache is not None:
            self._save_prefix(lane, lane.committed_len)
            self.prefix_cache.unpin(lane.prefix)
            lane.prefix = []
        released = self._call("release", [lane], self.primitives.release, lane.slot) is not _FAULT
        del self._lanes[lane.lane_id]
        if released:
            self._free_slots.append(lane.slot)
        else:
            self._quarantined[lane.slot] = lane.error or "release failed"
        if lane.drafter is not None:  # last: the executor's books are whole before the corpus grows
            lane.drafter.retire()  # the suffix drafter's text joins its scope's corpus

    # -- for tests and tools ----------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise AssertionError if any invariant of the executor's state is broken."""
        used = [lane.slot for lane in self._lanes.values()]
        if sorted(used + self._free_slots + list(self._quarantined)) != list(range(self.caps.max_lanes)):
            raise AssertionError(
                f"slots: used {sorted(used)}, free {sorted(self._free_slots)} and quarantined {sorted(self._quarantined)} "
                f"do not partition 0..{self.caps.max_lanes - 1}"
            )
        for lane in self._lanes.values():
            where = f"lane {lane.lane_id} (slot {lane.slot})"
            if lane.finish != Finish.NONE or lane.error is not None:
                raise AssertionError(f"{where}: finished ({lane.finish.name}, error {lane.error!r}) but not released")
            if not 0 <= lane.prefilled_len <= lane.prompt_len:
                raise AssertionError(f"{where}: prefilled {lane.prefilled_len} of {lane.prompt_len}")
            if lane.emitted_len and not lane.decoding:
                raise AssertionError(f"{where}: emitted before its prompt was prefilled")
            if len(lane.tokens) > self.caps.max_context:
                raise AssertionError(f"{where}: {len(lane.tokens)} tokens exceed the context {self.caps.max_context}")
            state_len = self.primitives.state_len(lane.slot)
            if state_len != lane.committed_len:
                raise AssertionError(f"{where}: backend state holds {state_len} positions, the lane committed {lane.committed_len}")
            if lane.drafter is not None and lane.drafter.history_len != len(lane.tokens):
                raise AssertionError(f"{where}: drafter history {lane.drafter.history_len} != tokens {len(lane.tokens)}")
            if self.prefix_cache is not None and len(lane.prefix) * self.prefix_cache.block_tokens > state_len:
                raise AssertionError(f"{where}: pins {len(lane.prefix)} cached blocks past its {state_len} positions")
        if self.prefix_cache is not None:
            self.prefix_cache.check_integrity()
            pins = sum(len(lane.prefix) for lane in self._lanes.values())
            if pins != self.prefix_cache.pins():
                raise AssertionError(f"prefix cache: lanes pin {pins} blocks, the cache counts {self.prefix_cache.pins()}")
        for slot in self._free_slots:
            if self.primitives.state_len(slot) != 0:
                raise AssertionError(f"free slot {slot}: backend state holds {self.primitives.state_len(slot)} positions")
        for grant in self._grants.values():
            if grant.shared is not None:
                grant.shared.check_integrity()

    def snapshot(self) -> tuple:
        """A value that changes whenever the executor's observable state does."""
        lanes = tuple(
            (l.lane_id, l.slot, tuple(l.tokens), l.prefilled_len, int(l.finish), self.primitives.state_len(l.slot))
            for l in sorted(self._lanes.values(), key=lambda l: l.lane_id)
        )
        shared = tuple(getattr(g.shared, "version", None) for g in self._grants.values())
        return (
            lanes, tuple(sorted(self._free_slots)), tuple(r.written for r in self._rings),
            tuple(sorted(self._prompts)), tuple(sorted(self._quarantined)), shared,
            None if self.prefix_cache is None else (len(self.prefix_cache), self.prefix_cache.bytes),
        )
