"""Continuous batching: one thread owns the engine's batch (n slots over one KV cache). Between
two steps it drops cancelled requests, starts waiting ones in free slots, then runs one step:
chunked prefill of new prompts interleaved with one decode token for every running request. Token
events go back to each request's asyncio queue through its event loop.

    HTTP handlers --submit--> waiting (bounded) --start--> slots --step--> deliver(event)
                  <--cancel-- (disconnect, stop string, timeout)
"""

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ats_infer.serve.errors import APIError
from ats_infer.serve.metrics import Metrics

log = logging.getLogger("ats_infer")

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2  # ats_native.FINISH_*


class EngineBatch(Protocol):
    """What the scheduler drives: ats_native.Batch, or the torch engine's TorchBatch."""

    n_slots: int

    def start(self, slot: int, prompt: list[int], max_new_tokens: int, **sampling: Any) -> None: ...
    def step(self, prefill_budget: int = 0) -> list[tuple]: ...
    def cancel(self, slot: int) -> None: ...


@dataclass
class TokenEvent:
    token: int
    finish: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class ErrorEvent:
    message: str


@dataclass
class Job:
    """One choice of one request: a prompt and its sampling settings, in the sense of
    ats_native.Batch.start."""

    prompt: list[int]
    max_new_tokens: int
    sampling: dict[str, Any]
    deliver: Callable[[TokenEvent | ErrorEvent], None]
    cancelled: bool = False
    submitted: float = field(default_factory=time.monotonic)
    # set by for_loop: the step's token events of all jobs of one loop go in one wake-up of it
    loop: asyncio.AbstractEventLoop | None = None
    queue: asyncio.Queue | None = None

    @classmethod
    def for_loop(cls, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, **kw: Any) -> "Job":
        def deliver(event: TokenEvent | ErrorEvent) -> None:
            post(loop, [(job, event)])

        job = cls(deliver=deliver, loop=loop, queue=queue, **kw)
        return job


def post(loop: asyncio.AbstractEventLoop, items: list[tuple[Job, TokenEvent | ErrorEvent]]) -> None:
    """Puts each event on its job's queue, in one call into the loop's thread."""

    def put_all() -> None:
        for job, event in items:
            job.queue.put_nowait(event)

    try:
        loop.call_soon_threadsafe(put_all)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        for job, _ in items:
            job.cancelled = True


class Scheduler:
    def __init__(
        self, batch: EngineBatch, metrics: Metrics, max_queue: int, prefill_budget: int
    ) -> None:
        self.batch = batch
        self.metrics = metrics
        self.max_queue = max_queue
        self.prefill_budget = prefill_budget
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: dict[int, Job] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ats-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Cancels every request (each gets an ErrorEvent) and joins the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    def submit(self, jobs: list[Job]) -> None:
        """Queues all of jobs or none: 503 with Retry-After when the queue is full."""
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down", code="shutting_down")
            if len(self._waiting) + len(jobs) > self.max_queue:
                raise APIError(
                    503,
                    f"the server's queue is full ({self.max_queue} waiting requests); retry later",
                    code="queue_full",
                    headers={"retry-after": "1"},
                )
            self._waiting.extend(jobs)
            self.metrics.waiting.set(len(self._waiting))
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    # ---- the scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stopping:
                    break
                admitted = self._admit()
            self._drop_cancelled()
            for slot, job in admitted:
                self._start(slot, job)
            if self._running:
                self._step()
        self._fail_all("the server is shutting down")

    def _admit(self) -> list[tuple[int, Job]]:
        """Free slots paired with waiting jobs (called with the lock held)."""
        free = [s for s in range(self.batch.n_slots) if s not in self._running]
        admitted = []
        while free and self._waiting:
            job = self._waiting.popleft()
            if not job.cancelled:
                slot = free.pop(0)
                self._running[slot] = job
                admitted.append((slot, job))
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.running.set(len(self._running))
        return admitted

    def _start(self, slot: int, job: Job) -> None:
        try:
            self.batch.start(slot, job.prompt, job.max_new_tokens, **job.sampling)
        except ValueError as err:  # the engine's own check of the request
            del self._running[slot]
            job.deliver(ErrorEvent(str(err)))
            return
        self.metrics.prompt_tokens.inc(len(job.prompt))

    def _drop_cancelled(self) -> None:
        for slot, job in list(self._running.items()):
            if job.cancelled:
                self.batch.cancel(slot)
                del self._running[slot]
        self.metrics.running.set(len(self._running))

    def _step(self) -> None:
        try:
            events = self.batch.step(self.prefill_budget)
        except ValueError as err:
            log.error("batch step failed: %s", err)
            self._fail_running(f"the engine failed: {err}")
            return
        self.metrics.generation_tokens.inc(len(events))
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for slot, token, finish, logprob, top in events:
            job = self._running[slot]
            event = TokenEvent(token, finish, logprob, top)
            if job.loop is None:
                job.deliver(event)
            else:
                by_loop.setdefault(job.loop, []).append((job, event))
            if finish != FINISH_NONE:
                del self._running[slot]
        for loop, items in by_loop.items():
            post(loop, items)
        self.metrics.running.set(len(self._running))

    def _fail_running(self, message: str) -> None:
        for slot, job in list(self._running.items()):
            self.batch.cancel(slot)
            job.deliver(ErrorEvent(message))
        self._running.clear()

    def _fail_all(self, message: str) -> None:
        self._fail_running(message)
        with self._cond:
            while self._waiting:
                self._waiting.popleft().deliver(ErrorEvent(message))
        self.metrics.running.set(0)
        self.metrics.waiting.set(0)
