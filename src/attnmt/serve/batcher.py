"""Dynamic batching: the sentences of concurrent requests are searched together.

Each sentence of a request is queued as a :class:`Job`. One worker thread takes jobs out in
batches. Starting from the oldest waiting job, it waits up to ``max_wait_ms`` for other jobs
to share the batch (less once the queue already holds a full token budget), then takes, among
the waiting jobs with the same search options (beam size, n-best), those nearest in source
length to the oldest one, as many as fit the token budget: sentences x longest source x beam
size <= ``batch_tokens`` (the oldest job always goes, even when it alone is over budget).
Batches of similar lengths waste little on padding, and the oldest job is never passed over.

The search runs in the worker thread, so the asyncio event loop that serves HTTP never waits
for it; each result goes back to its request's future with ``loop.call_soon_threadsafe``.

Library: the standard library's ``threading`` and ``asyncio``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class Busy(Exception):
    """The batcher takes no more jobs now; the client should retry later (an HTTP 503)."""


class QueueFull(Busy):
    """The queue has no room for a request's sentences."""


class Closed(Busy):
    """The batcher is shutting down and takes no new jobs."""


@dataclass(eq=False)
class Job:
    """One sentence waiting to be translated.

    text: the raw sentence. length: its source length in subwords (EOS included). key: the
    search options; only jobs with equal keys share a batch. width: the beams each sentence
    occupies (the beam size). payload: anything the batch function needs (e.g. whether to
    return attention). future: resolved with the result, on ``loop``. queued_at: when it was
    queued (``time.perf_counter()`` seconds). cancelled: set when its request gave up waiting.
    """

    text: str
    length: int
    key: Hashable
    width: int
    payload: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    queued_at: float = field(default_factory=time.perf_counter)
    cancelled: bool = False


def batch_cost(count: int, longest: int, width: int) -> int:
    """Tokens a batch occupies: sentences x longest source (padding included) x beam size."""
    return count * longest * width


def take_batch(pending: list[Job], budget: int) -> list[Job]:
    """Choose the next batch from the waiting jobs (oldest first) without changing the list.

    The oldest job, then among the jobs with its key those nearest to it in source length,
    while the batch's :func:`batch_cost` stays within ``budget``.

    Returns:
        The chosen jobs, sorted by source length (shortest first); empty when nothing waits.
    """
    if not pending:
        return []
    anchor = pending[0]
    same = sorted((j for j in pending if j.key == anchor.key), key=lambda j: j.length)
    at = same.index(anchor)
    lo, hi = at, at  # same[lo:hi + 1] is chosen
    longest = anchor.length
    while True:
        below = same[lo - 1] if lo > 0 else None
        above = same[hi + 1] if hi + 1 < len(same) else None
        if below is None and above is None:
            break
        take_below = above is None or (below is not None and anchor.length - below.length <= above.length - anchor.length)
        candidate = below if take_below else above
        new_longest = max(longest, candidate.length)
        if batch_cost(hi - lo + 2, new_longest, anchor.width) > budget:
            break
        longest = new_longest
        lo, hi = (lo - 1, hi) if take_below else (lo, hi + 1)
    return same[lo: hi + 1]


class DynamicBatcher:
    """Queue sentences from many requests; search them in length-sorted, budgeted batches.

    Args:
        run_batch: called in the worker thread with a list of jobs of one key; returns one
            result per job, in order. An exception fails every job of that batch.
        batch_tokens: the token budget of a batch (:func:`batch_cost`).
        max_wait_ms: how long the oldest job waits for company, in milliseconds.
        max_queue: most jobs waiting; :meth:`submit` raises :class:`QueueFull` beyond it.
        on_batch: optional callback ``(jobs, started, seconds)`` after each batch (metrics),
            ``started`` a ``time.perf_counter()`` value.
    """

    def __init__(self, run_batch: Callable[[list[Job]], list[Any]], batch_tokens: int, max_wait_ms: float,
                 max_queue: int, on_batch: Callable[[list[Job], float, float], None] | None = None):
        self.run_batch = run_batch
        self.batch_tokens = batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._pending: list[Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="attnmt-batcher", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        """Jobs waiting now."""
        return len(self._pending)

    def submit(self, jobs: list[Job]) -> None:
        """Queue a request's jobs, all or none.

        Raises:
            QueueFull: fewer than ``len(jobs)`` free places in the queue.
            Closed: the batcher is shutting down.
        """
        with self._cond:
            if self._closed:
                raise Closed("the server is shutting down")
            if len(self._pending) + len(jobs) > self.max_queue:
                raise QueueFull(f"{len(self._pending)} sentences are queued (limit {self.max_queue})")
            self._pending.extend(jobs)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        """Take no new jobs, finish the queued ones, and stop the worker (blocks until then)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _queued_cost(self) -> int:
        return sum(batch_cost(1, j.length, j.width) for j in self._pending)

    def _next_batch(self) -> list[Job] | None:
        """Wait for work; None once closed and drained."""
        with self._cond:
            while True:
                self._pending = [j for j in self._pending if not j.cancelled]
                if self._pending or self._closed:
                    break
                self._cond.wait()
            if not self._pending:
                return None
            deadline = self._pending[0].queued_at + self.max_wait
            while not self._closed and self._queued_cost() < self.batch_tokens:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = take_batch(self._pending, self.batch_tokens)
            chosen = set(map(id, batch))
            self._pending = [j for j in self._pending if id(j) not in chosen]
            return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            started = time.perf_counter()
            try:
                results = self.run_batch(batch)
                outcomes = [(job, result, None) for job, result in zip(batch, results, strict=True)]
            except Exception as e:  # noqa: BLE001  (a failed batch fails its requests, not the server)
                log.exception("a batch of %d sentences failed", len(batch))
                outcomes = [(job, None, e) for job in batch]
            if self.on_batch is not None:
                self.on_batch(batch, started, time.perf_counter() - started)
            for job, result, error in outcomes:
                try:
                    job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
                except RuntimeError:  # the request's event loop has closed: nobody waits for it
                    pass


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the request timed out or its client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
