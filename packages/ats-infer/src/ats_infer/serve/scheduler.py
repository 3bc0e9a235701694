"""Continuous batching: one thread owns the engine's batch (n slots over one KV cache). Between
two steps it drops cancelled requests, starts waiting ones in free slots, then runs one step:
chunked prefill of new prompts interleaved with one decode token for every running request. A
step's token events go to the Mailbox of each request's event loop, which the next step wakes.

    HTTP handlers --submit--> waiting (bounded) --start--> slots --step--> mailbox --> queues
                  <--cancel-- (disconnect, stop string, timeout)
"""

import asyncio
import collections
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ats_infer.serve.errors import APIError
from ats_infer.serve.metrics import Metrics

log = logging.getLogger("ats_infer")

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2  # ats_native.FINISH_*
SWITCH_INTERVAL_S = 0.0005  # sys.setswitchinterval while serving: see Scheduler.start


class EngineBatch(Protocol):
    """What the scheduler drives: ats_native.Batch, or the torch engine's TorchBatch."""

    n_slots: int

    def start(self, slot: int, prompt: list[int], max_new_tokens: int, **sampling: Any) -> None: ...
    def step(self, prefill_budget: int = 0, wake_fds: Sequence[int] = ()) -> list[tuple]: ...
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


class Mailbox:
    """The token events of the jobs of one event loop. The scheduler thread puts (job, event)
    pairs here and wakes the loop with one byte on a pipe the loop watches; the loop then puts
    each event on its job's queue. A step's events are woken from inside the next step, after
    the engine released the GIL (EngineBatch.step's wake_fds): the loop handles one step's
    events while the next step computes, where a wake-up by call_soon_threadsafe left the
    scheduler thread waiting for the GIL until the loop had handled them (py-spy: ~9% of the
    scheduler thread's time at concurrency 1, the next step not started meanwhile)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called in loop's thread (it watches the pipe from now on)."""
        self.loop = loop
        self._items: collections.deque[tuple[Job, TokenEvent | ErrorEvent]] = collections.deque()
        self._read_fd, self.wake_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self.wake_fd, False)
        loop.add_reader(self._read_fd, self._drain)

    def put(self, job: "Job", event: "TokenEvent | ErrorEvent") -> None:
        """Any thread; the event reaches the job's queue after the next wake-up."""
        self._items.append((job, event))

    def wake(self) -> None:
        """Any thread: wakes the loop now (events that no step follows)."""
        try:
            os.write(self.wake_fd, b"\0")
        except BlockingIOError:  # the pipe is full: a wake-up is already pending
            pass

    def _drain(self) -> None:
        try:
            while os.read(self._read_fd, 4096):
                pass
        except BlockingIOError:  # read to the end
            pass
        while self._items:
            job, event = self._items.popleft()
            job.queue.put_nowait(event)

    def close(self) -> None:
        """In the loop's thread, once no thread puts or wakes any more."""
        if not self.loop.is_closed():
            self.loop.remove_reader(self._read_fd)
        os.close(self._read_fd)
        os.close(self.wake_fd)


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
    # set by for_mailbox: a step's token events go to the mailbox, woken by the next step
    mailbox: Mailbox | None = None
    queue: asyncio.Queue | None = None

    @classmethod
    def for_mailbox(cls, mailbox: Mailbox, queue: asyncio.Queue, **kw: Any) -> "Job":
        def deliver(event: TokenEvent | ErrorEvent) -> None:
            mailbox.put(job, event)
            mailbox.wake()

        job = cls(deliver=deliver, mailbox=mailbox, queue=queue, **kw)
        return job


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
        self._mailboxes: dict[asyncio.AbstractEventLoop, Mailbox] = {}
        self._to_wake: list[Mailbox] = []  # holding events of the last step (scheduler thread)
        self._thread = threading.Thread(target=self._run, name="ats-scheduler", daemon=True)

    def start(self) -> None:
        # The event loop handles a step's events while the next step computes (Mailbox), so when
        # a step ends the scheduler thread may find the loop holding the GIL; the interpreter
        # makes the holder let go only after the switch interval (5 ms by default), a wait that
        # capped a small model's steps at ~200/s (concurrency 8 at half its rate with the loop
        # and the steps taking turns). Process-wide, for the server's process.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Cancels every request (each gets an ErrorEvent) and joins the thread; then, in the
        loops' thread, closes the mailboxes (left open if the thread is still running: it may
        still write to their pipes)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        if not self._thread.is_alive():
            for mailbox in self._mailboxes.values():
                mailbox.close()
            self._mailboxes.clear()

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        """The mailbox of loop (called in loop's thread), made at its first request."""
        with self._cond:
            if loop not in self._mailboxes:
                self._mailboxes[loop] = Mailbox(loop)
            return self._mailboxes[loop]

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
                if not self._stopping and not self._waiting and not self._running:
                    self._wake()  # no step follows to wake them
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
        self._wake()
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

    def _wake(self) -> None:
        for mailbox in self._to_wake:
            mailbox.wake()
        self._to_wake.clear()

    def _step(self) -> None:
        wake_fds = [mailbox.wake_fd for mailbox in self._to_wake]
        self._to_wake.clear()
        try:
            events = self.batch.step(self.prefill_budget, wake_fds)
        except ValueError as err:
            log.error("batch step failed: %s", err)
            self._fail_running(f"the engine failed: {err}")
            return
        self.metrics.generation_tokens.inc(len(events))
        for slot, token, finish, logprob, top in events:
            job = self._running[slot]
            event = TokenEvent(token, finish, logprob, top)
            if job.mailbox is None:
                job.deliver(event)
            else:
                job.mailbox.put(job, event)
                if job.mailbox not in self._to_wake:
                    self._to_wake.append(job.mailbox)
            if finish != FINISH_NONE:
                del self._running[slot]
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
