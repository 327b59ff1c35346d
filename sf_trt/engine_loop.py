"""The engine loop: requests that come and go, over one Executor owned by one thread.

:class:`EngineLoop` runs :class:`~sf_trt.scheduler.Scheduler` steps on a thread of
its own while there is work, and sleeps when there is none. Any thread or asyncio
event loop may call :meth:`EngineLoop.submit` (which checks the request, queues
it and returns a :class:`RequestStream` of its :class:`Output`\\ s) and
:meth:`EngineLoop.abort` (the lane is freed at the loop's next turn, within one
tick). Nothing else touches the Executor. The HTTP server (:mod:`sf_trt.serve`)
is a shell over this class; this module imports no HTTP code.

Lifecycle: :meth:`start` the thread; :meth:`drain` stops admitting (submits are
refused with :class:`NotServing`, queued requests end with an error), lets the
running ones finish and ends those still running at the deadline with an error;
:meth:`shutdown` drains and joins the thread. A tick that fails ends the requests
of that tick with an error and the loop goes on; if even releasing their lanes
fails, every request ends with the error and the loop stops serving (nothing is
rebuilt behind the caller's back).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Iterator, Optional, Protocol

from .abi import Finish
from .executor import Executor, ExecutorConfig, check_prompt
from .outputs import RequestOutput
from .primitives import PrimitivesBase
from .scheduler import Request, Scheduler, SchedulerConfig, Update

__all__ = ["SHUTDOWN_ERROR", "LoopConfig", "Output", "RequestStream", "EngineLoop", "LoopObserver", "Overloaded", "NotServing"]

log = logging.getLogger("sf_trt.engine_loop")


SHUTDOWN_ERROR = "the server is shutting down"
"""How the error of a request ended by :meth:`EngineLoop.drain` begins."""


class Overloaded(Exception):
    """The queue of waiting requests is full; try again later (HTTP 429)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotServing(Exception):
    """The loop is draining, stopped or failed and takes no new requests (HTTP 503)."""


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How the engine loop runs.

    ``max_queued``: requests that may wait with no free lane for them (more are
    refused with :class:`Overloaded`; 0: none wait, a request is taken only when a
    lane is free for it); ``scheduler``: how the scheduler runs (default
    :meth:`SchedulerConfig.serving`, the serving profile); ``executor``: the
    Executor's configuration.
    """

    max_queued: int = 256
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig.serving)
    executor: ExecutorConfig = ExecutorConfig()

    def __post_init__(self) -> None:
        if isinstance(self.max_queued, bool) or not isinstance(self.max_queued, int) or self.max_queued < 0:
            raise ValueError(f"LoopConfig: max_queued must be an int >= 0 (got {self.max_queued!r})")


Output = RequestOutput
"""What a :class:`RequestStream` yields: the one outward record, as deltas (one per
step that changed the request; the last has ``finish != Finish.NONE``)."""


class LoopObserver(Protocol):
    """Hooks the loop thread calls (metrics); they must be quick and thread-safe."""

    def on_output(self, output: Output) -> None: ...

    def on_state(self, running: int, waiting: int) -> None: ...


class RequestStream:
    """The outputs of one request, in order, ending with a finished one.

    Iterate it with ``async for`` on the event loop that submitted it, or with ``for``
    from a thread (submitted outside an event loop).
    """

    def __init__(self, request_id: str, seq_id: int) -> None:
        self.request_id = request_id
        self.seq_id = seq_id
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._async: Optional[asyncio.Queue] = asyncio.Queue() if self._loop is not None else None
        self._sync: queue.SimpleQueue = queue.SimpleQueue()
        self.finished = False

    def _put(self, output: Output) -> None:
        """Called by the loop thread."""
        if self._loop is None:
            self._sync.put(output)
            return
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, output)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    async def __aiter__(self) -> AsyncIterator[Output]:
        if self._async is None:
            raise RuntimeError("RequestStream: submitted outside an event loop; iterate it with `for`")
        while not self.finished:
            out = await self._async.get()
            self.finished = out.finished
            yield out

    def __iter__(self) -> Iterator[Output]:
        if self._async is not None:
            raise RuntimeError("RequestStream: submitted on an event loop; iterate it with `async for`")
        while not self.finished:
            out = self._sync.get()
            self.finished = out.finished
            yield out


class EngineLoop:
    """Runs requests that come and go on ``primitives`` (module docstring)."""

    def __init__(
        self,
        primitives: PrimitivesBase,
        *,
        tokenizer: Any = None,
        config: LoopConfig = LoopConfig(),
        observer: Optional[LoopObserver] = None,
    ) -> None:
        self.config = config
        self.primitives = primitives
        self.caps = primitives.capabilities
        self.tokenizer = tokenizer
        self.observer = observer
        self.executor = Executor(primitives, config.executor)
        self.scheduler = Scheduler(self.executor, config.scheduler, tokenizer=tokenizer)
        self._cond = threading.Condition()
        self._inbox: list[tuple[str, Any]] = []
        self._streams: dict[int, RequestStream] = {}  # seq id -> stream, while live
        self._ids: dict[str, int] = {}  # request id -> seq id, while live
        self._seq_ids = itertools.count(1)
        self._waiting = 0  # submitted, not yet admitted (the loop keeps it current)
        self._running = 0
        self._draining = False
        self._drain_deadline: Optional[float] = None
        self._stopping = False
        self.failure: Optional[str] = None
        self._thread: Optional[threading.Thread] = None

    # -- any thread ---------------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def num_waiting(self) -> int:
        return self._waiting

    @property
    def num_lanes(self) -> int:
        """Lane slots that can take a request (those quarantined after a failed release hold none)."""
        return self.caps.max_lanes - len(self.executor.quarantined)

    @property
    def capacity(self) -> int:
        """The most requests the loop holds at once: a lane each, plus ``max_queued`` waiting.
        A batch of more requests than this can never be taken whole."""
        return self.num_lanes + self.config.max_queued

    @property
    def started(self) -> bool:
        """:meth:`start` was called."""
        return self._thread is not None

    @property
    def serving(self) -> bool:
        """Taking requests: started, not draining, not failed."""
        return self._thread is not None and self._thread.is_alive() and not self._draining and self.failure is None

    @property
    def unavailable(self) -> Optional[str]:
        """Why the loop takes no new requests (draining, failed, not started); None while it serves."""
        return None if self.serving else self._not_serving_reason()

    def check(self, request: Request) -> None:
        """Refuse (StatusError) a request the loop cannot run; what :meth:`submit` checks."""
        check_prompt(request.prompt_ids, self.caps)
        self.scheduler.check(request)  # reads only the capabilities and the tokenizer

    def submit(self, request: Request, request_id: Optional[str] = None, *, checked: bool = False) -> RequestStream:
        """Queue ``request``; its stream. Raises StatusError (a bad request),
        :class:`Overloaded` (the queue is full) or :class:`NotServing`. A request is
        checked once, here at the door (:meth:`check`), or before by the caller
        (``checked=True``: the server checks every choice of a job before it submits
        any); the loop thread queues it without checking it again."""
        if not checked:
            self.check(request)
        with self._cond:
            if not self.serving:
                raise NotServing(self._not_serving_reason())
            # the requests already here that no free lane awaits; this one would join them
            queued = self._waiting + self._running - self.num_lanes
            if queued >= self.config.max_queued:
                raise Overloaded(f"{queued} requests are waiting for a lane (--max-queued-requests {self.config.max_queued})")
            seq_id = next(self._seq_ids) % 2**32
            request_id = request_id or f"req-{seq_id}"
            if request_id in self._ids:
                raise ValueError(f"submit: request id {request_id!r} is already live")
            stream = RequestStream(request_id, seq_id)
            self._streams[seq_id] = stream
            self._ids[request_id] = seq_id
            self._waiting += 1
            self._inbox.append(("add", (request, seq_id, time.perf_counter())))
            self._cond.notify()
        return stream

    def abort(self, request_id: str) -> bool:
        """End a request now (``Finish.ABORTED``); False if it is not live."""
        with self._cond:
            seq_id = self._ids.get(request_id)
            if seq_id is None:
                return False
            self._inbox.append(("abort", seq_id))
            self._cond.notify()
        return True

    def start(self) -> "EngineLoop":
        if self._thread is not None:
            raise RuntimeError("EngineLoop.start: already started")
        self._thread = threading.Thread(target=self._run, name="sf_trt-engine-loop", daemon=True)
        self._thread.start()
        return self

    def drain(self, timeout_s: float) -> None:
        """Stop admitting; end queued requests now and running ones at ``timeout_s`` with an error."""
        with self._cond:
            if not self._draining:
                self._draining = True
                self._drain_deadline = time.monotonic() + max(0.0, timeout_s)
            self._cond.notify()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Drain, then stop the thread once nothing runs."""
        self.drain(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s + 30.0)

    def __enter__(self) -> "EngineLoop":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown(0.0)

    def _not_serving_reason(self) -> str:
        if self.failure is not None:
            return f"the engine failed and serves no more requests ({self.failure})"
        if self._draining:
            return SHUTDOWN_ERROR
        return "the engine loop is not running"

    # -- the loop thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        sched = self.scheduler
        while True:
            with self._cond:
                while not self._inbox and not sched.has_work and not self._stopping and not self._draining:
                    self._cond.wait(0.5)
                inbox, self._inbox = self._inbox, []
                stopping, draining, deadline = self._stopping, self._draining, self._drain_deadline
            try:
                self._deliver(self._take(inbox))
                if draining:
                    self._deliver(self._drain_step(deadline))
                if stopping and not sched.has_work:
                    break
                if sched.has_work:
                    self._deliver(sched.step())
                elif draining and not stopping:
                    with self._cond:  # nothing to do until shutdown(): don't spin
                        if not self._stopping and not self._inbox:
                            self._cond.wait(0.1)
            except Exception as exc:  # noqa: BLE001 - the backend is in an unknown state: stop serving, say why
                self._fail(exc)
                break
            self._publish_state()
        self._publish_state()

    def _take(self, inbox: list) -> list:
        updates = []
        for kind, arg in inbox:
            if kind == "add":
                request, seq_id, arrival = arg
                try:
                    self.scheduler.add(request, seq_id, arrival, checked=True)
                except Exception as exc:  # noqa: BLE001 - checked at submit; anything left ends this request only
                    updates.append(self._refused(seq_id, f"{type(exc).__name__}: {exc}"))
            else:
                update = self.scheduler.abort(arg)
                if update is not None:
                    updates.append(update)
        return updates

    def _drain_step(self, deadline: Optional[float]) -> list[Update]:
        sched = self.scheduler
        updates = []
        for seq in list(sched.waiting):
            updates.append(sched.abort(seq.seq_id, f"{SHUTDOWN_ERROR} (the request had not started)"))
        if deadline is not None and time.monotonic() >= deadline:
            for seq_id in list(sched.running):
                updates.append(sched.abort(seq_id, f"{SHUTDOWN_ERROR} (the request was cut at the drain timeout)"))
        return [u for u in updates if u is not None]

    def _refused(self, seq_id: int, error: str) -> tuple[int, Output]:
        """The one output of a request that never reached the scheduler."""
        now = time.perf_counter()
        return seq_id, RequestOutput(seq_id, [], None, None, Finish.ERROR, None, error, 0, 0, arrival=now, finished_at=now)

    def _deliver(self, updates: list) -> None:
        """Hand outputs to their streams (and the observer): scheduler updates or
        ``(seq_id, Output)`` pairs."""
        for item in updates:
            seq_id, out = item if isinstance(item, tuple) else (item.seq.seq_id, item.seq.output(item))
            if self.observer is not None:
                try:
                    self.observer.on_output(out)
                except Exception:  # noqa: BLE001 - metrics never stop the loop
                    log.exception("observer.on_output failed")
            stream = self._streams.get(seq_id)
            if stream is not None:
                stream._put(out)
                if out.finished:
                    with self._cond:
                        del self._streams[seq_id]
                        self._ids.pop(stream.request_id, None)

    def _publish_state(self) -> None:
        sched = self.scheduler
        with self._cond:
            queued = sum(1 for kind, _ in self._inbox if kind == "add")
            self._waiting = len(sched.waiting) + queued
            self._running = len(sched.running)
        if self.observer is not None:
            try:
                self.observer.on_state(self._running, self._waiting)
            except Exception:  # noqa: BLE001
                log.exception("observer.on_state failed")

    def _fail(self, exc: BaseException) -> None:
        with self._cond:  # a submit after this sees the failure; one before it is in _streams below
            self.failure = f"{type(exc).__name__}: {exc}"
        log.error("engine loop failed, no more requests are served: %s", self.failure)
        error = f"the engine failed: {self.failure}"
        updates = []
        sched = self.scheduler
        for seq in list(sched.waiting) + list(sched.running.values()):
            updates.append(seq.end(Finish.ERROR, time.perf_counter(), error))
        sched.waiting.clear()
        sched.running.clear()
        with self._cond:
            self._inbox = []
        self._deliver(updates)
        with self._cond:  # whatever is still live (queued, or lost inside the failed step)
            live = list(self._streams)
        self._deliver([self._refused(seq_id, error) for seq_id in live])
