"""Dynamic batching: concurrent submissions share batches, each caller gets its own result."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from vitlab.serve.batcher import Batcher


class Recorder:
    """A batch function that doubles numbers and remembers the batches and the threads."""

    def __init__(self, delay: float = 0.0, fail_on=None):
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.delay, self.fail_on = delay, fail_on

    def __call__(self, items):
        self.batches.append(list(items))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"cannot do {self.fail_on}")
        return [2 * i for i in items]


async def _submit_all(batcher: Batcher, items, spacing: float = 0.0):
    batcher.start()
    try:
        tasks = []
        for i in items:
            tasks.append(asyncio.create_task(batcher.submit(i)))
            if spacing:
                await asyncio.sleep(spacing)
        return await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.stop()


def test_concurrent_items_share_batches_up_to_the_limit():
    run = Recorder()
    with ThreadPoolExecutor(1, thread_name_prefix="model") as pool:
        out = asyncio.run(_submit_all(Batcher(run, pool, max_batch=4, max_wait_s=0.5), range(10)))
    assert [r for r, _ in out] == [2 * i for i in range(10)]  # each caller its own answer
    assert [len(b) for b in run.batches] == [4, 4, 2]  # full batches, then what was left
    assert sorted(i for b in run.batches for i in b) == list(range(10))
    assert [size for _, size in out] == [4] * 8 + [2] * 2
    assert run.threads == {"model_0"}  # never on the event loop's thread


def test_a_lone_item_waits_at_most_max_wait():
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        started = time.perf_counter()
        out = asyncio.run(_submit_all(Batcher(run, pool, max_batch=8, max_wait_s=0.05), [7]))
        took = time.perf_counter() - started
    assert out == [(14, 1)]
    assert 0.04 <= took < 2.0  # waited for company, then ran alone


def test_items_arriving_within_the_wait_join_the_batch_later_ones_do_not():
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        asyncio.run(_submit_all(Batcher(run, pool, max_batch=64, max_wait_s=0.3), range(3), spacing=0.02))
        asyncio.run(_submit_all(Batcher(run, pool, max_batch=64, max_wait_s=0.0), range(3), spacing=0.05))
    assert run.batches[0] == [0, 1, 2]
    assert run.batches[1:] == [[0], [1], [2]]  # no wait: every item alone


def test_max_batch_one_serves_one_at_a_time():
    run = Recorder()
    with ThreadPoolExecutor(1) as pool:
        out = asyncio.run(_submit_all(Batcher(run, pool, max_batch=1, max_wait_s=0.1), range(5)))
    assert run.batches == [[0], [1], [2], [3], [4]]
    assert [size for _, size in out] == [1] * 5


def test_a_failing_batch_fails_its_callers_and_the_next_batch_runs():
    run = Recorder(fail_on=1)
    with ThreadPoolExecutor(1) as pool:
        out = asyncio.run(_submit_all(Batcher(run, pool, max_batch=2, max_wait_s=0.2), range(4)))
    assert all(isinstance(r, ValueError) for r in out[:2])  # both callers of the bad batch
    assert out[2:] == [(4, 2), (6, 2)]


def test_two_batchers_share_one_model_thread_one_batch_at_a_time():
    busy, overlaps = [0], [0]
    lock = threading.Lock()

    def run(items):
        with lock:
            busy[0] += 1
            overlaps[0] = max(overlaps[0], busy[0])
        time.sleep(0.02)
        with lock:
            busy[0] -= 1
        return items

    async def both(pool):
        a, b = Batcher(run, pool, 4, 0.01), Batcher(run, pool, 4, 0.01)
        a.start()
        b.start()
        try:
            return await asyncio.gather(*(x.submit(i) for i in range(12) for x in (a, b)))
        finally:
            await a.stop()
            await b.stop()

    with ThreadPoolExecutor(1) as pool:
        out = asyncio.run(both(pool))
    assert [r for r, _ in out] == [i for i in range(12) for _ in range(2)]
    assert overlaps[0] == 1


def test_stopping_fails_waiting_items_and_submit_needs_a_running_batcher():
    run = Recorder(delay=0.2)

    async def scenario(pool):
        batcher = Batcher(run, pool, max_batch=1, max_wait_s=0.0)
        with pytest.raises(RuntimeError, match="not running"):
            await batcher.submit(1)
        batcher.start()
        tasks = [asyncio.create_task(batcher.submit(i)) for i in range(3)]
        await asyncio.sleep(0.05)  # the first is running, two are waiting
        await batcher.stop()
        return await asyncio.gather(*tasks, return_exceptions=True)

    with ThreadPoolExecutor(1) as pool:
        out = asyncio.run(scenario(pool))
    assert all(isinstance(r, RuntimeError) and "shutting down" in str(r) for r in out)


def test_max_batch_must_be_positive():
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(Recorder(), ThreadPoolExecutor(1), max_batch=0, max_wait_s=0.0)
