"""The one scheduler of whole requests over the Executor.

Both the batch :class:`~sf_trt.generate.Generator` and the serving
:class:`~sf_trt.engine_loop.EngineLoop` drive an Executor through this class.
One :meth:`Scheduler.step` reads like this::

    plan       admit waiting sequences into free lanes (oldest first), each from
               the longest prefix the executor's prefix cache holds for it; prefill
               prompt chunks (per lane ``prefill_chunk``, per tick ``prefill_budget``)
               beside the lanes that decode ``tick_tokens`` each, with the draft
               cap the drafting policy sets for the tick (``first_token_tick``,
               serving: while a lane's first token is due, one pass without drafts
               for every lane, so that token streams as soon as it is drawn)
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

The package, by concern: :mod:`.requests` (what a request asks for, drafter names,
RNG keys of choices), :mod:`.sequence` (a request's progress and what each step
adds), :mod:`.policy` (the drafting policy), :mod:`.config` (how it runs:
:class:`SchedulerConfig`) and :mod:`.scheduler` (the step).
"""

from .config import SchedulerConfig
from .policy import DraftPolicy, LoadAwareDrafting
from .requests import DEFAULT_DRAFTER, DRAFTERS, Request, choice_key, strategy_id
from .scheduler import Scheduler
from .sequence import Sequence, Update

__all__ = [
    "Request", "strategy_id", "DRAFTERS", "DEFAULT_DRAFTER", "choice_key", "Sequence", "Update",
    "DraftPolicy", "LoadAwareDrafting", "SchedulerConfig", "Scheduler",
]
