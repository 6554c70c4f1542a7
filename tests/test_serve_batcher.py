"""The dynamic batcher on its own, with a stand-in search: batch choice, waiting, limits, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from pydantic import ValidationError

from attnmt.serve.batcher import Closed, DynamicBatcher, Job, QueueFull, batch_cost, take_batch
from attnmt.serve.settings import ServeSettings


def _job(length, key=(4, 1), width=4, text=None, loop=None):
    return Job(text or f"s{length}", length, key, width, None, loop.create_future() if loop else None, loop)


def test_take_batch_starts_at_the_oldest_and_adds_the_nearest_lengths_within_budget():
    pending = [_job(n) for n in (10, 30, 9, 11, 50, 12, 2)]
    batch = take_batch(pending, budget=batch_cost(4, 12, 4))
    assert [j.length for j in batch] == [9, 10, 11, 12]  # 10 first; 30, 50 and 2 are farther
    assert batch_cost(len(batch), max(j.length for j in batch), 4) <= batch_cost(4, 12, 4)
    assert pending[0] in batch


def test_take_batch_keeps_search_options_apart_and_sends_an_oversized_sentence_alone():
    pending = [_job(5, key=(4, 1)), _job(5, key=(1, 1), width=1), _job(6, key=(4, 1)), _job(5, key=(4, 2))]
    assert take_batch(pending, budget=1000) == [pending[0], pending[2]]
    assert take_batch(pending, budget=3) == [pending[0]]  # 1 x 5 x 4 = 20 > 3, still served
    assert take_batch([], budget=10) == []


def test_concurrent_jobs_share_a_batch_and_each_gets_its_own_result():
    batches = []

    def run(jobs):
        batches.append([j.text for j in jobs])
        return [j.text.upper() for j in jobs]

    async def main():
        loop = asyncio.get_running_loop()
        batcher = DynamicBatcher(run, batch_tokens=10_000, max_wait_ms=200, max_queue=100)
        jobs = [_job(3 + i % 4, text=f"sentence {i}", loop=loop) for i in range(12)]
        for job in jobs:  # one request each
            batcher.submit([job])
        results = await asyncio.gather(*(j.future for j in jobs))
        batcher.close()
        return results

    results = asyncio.run(main())
    assert results == [f"SENTENCE {i}" for i in range(12)]
    assert len(batches) == 1 and sorted(batches[0]) == sorted(f"sentence {i}" for i in range(12))


def test_a_full_budget_does_not_wait_for_max_wait():
    async def main():
        loop = asyncio.get_running_loop()
        batcher = DynamicBatcher(lambda jobs: [len(jobs)] * len(jobs), batch_tokens=batch_cost(2, 5, 4),
                                 max_wait_ms=30_000, max_queue=10)
        jobs = [_job(5, loop=loop), _job(5, loop=loop)]
        started = time.perf_counter()
        batcher.submit(jobs)
        sizes = await asyncio.gather(*(j.future for j in jobs))
        batcher.close()
        return sizes, time.perf_counter() - started

    sizes, seconds = asyncio.run(main())
    assert sizes == [2, 2] and seconds < 10


def test_queue_limit_close_drains_and_errors_reach_every_request():
    release = threading.Event()

    def run(jobs):
        release.wait(10)
        if any(j.text == "bad" for j in jobs):
            raise RuntimeError("search failed")
        return [j.text for j in jobs]

    async def main():
        loop = asyncio.get_running_loop()
        batcher = DynamicBatcher(run, batch_tokens=2, max_wait_ms=0, max_queue=3)  # one sentence a batch
        first = _job(2, width=1, text="first", loop=loop)
        batcher.submit([first])
        await asyncio.sleep(0.2)  # the worker holds "first" (queue empty again)
        queued = [_job(2, width=1, text=t, loop=loop) for t in ("a", "b", "bad")]
        batcher.submit(queued[:2])
        with pytest.raises(QueueFull):
            batcher.submit([_job(2, width=1, loop=loop), _job(2, width=1, loop=loop)])  # 2 + 2 > 3
        batcher.submit(queued[2:])
        release.set()
        await loop.run_in_executor(None, batcher.close)  # finishes the queued jobs first
        with pytest.raises(Closed):
            batcher.submit([_job(2, loop=loop)])
        return await asyncio.gather(first.future, *(j.future for j in queued), return_exceptions=True)

    first, a, b, bad = asyncio.run(main())
    assert (first, a, b) == ("first", "a", "b")
    assert isinstance(bad, RuntimeError)


@pytest.mark.parametrize("name", ["max_body_bytes", "max_sentences", "max_chars", "max_beam_size", "batch_tokens",
                                  "max_queue", "retry_after_s", "request_timeout_s", "keep_alive_s",
                                  "attention_layer"])
def test_settings_reject_zero_and_negative_limits(name):
    for value in (0, -1):
        with pytest.raises(ValidationError):
            ServeSettings(**{name: value})
    assert getattr(ServeSettings(**{name: 3}), name) == 3


def test_settings_defaults_and_unknown_names():
    s = ServeSettings()
    assert s.max_wait_ms == 5.0 and s.attention_layer is None and s.max_queue >= s.max_sentences
    assert ServeSettings(max_wait_ms=0).max_wait_ms == 0  # no waiting is allowed
    with pytest.raises(ValidationError):
        ServeSettings(max_wait_ms=-1)
    with pytest.raises(ValidationError):
        ServeSettings(max_wait=5)
