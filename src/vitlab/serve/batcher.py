"""Dynamic batching: requests that arrive together share one forward pass.

Every forward pass pays a fixed cost besides its arithmetic (Python, dispatching some hundred
kernels, reading every weight from memory); a batch pays it once for all its images. For a
small model that fixed cost is most of the time. For ViT-B/16 at 224 px one image already
makes 197-row matrix products (Eq. 2-3), so on a CPU batching gains it little; docs/serving.md
has the measurements. Under load the server therefore waits a little (`max_wait_s`) for
company before running. TorchServe and Triton do the same; this is the few lines vitlab
needs, on asyncio.

`Batcher.submit(item)` is awaited by a request handler on the event loop. One worker task
takes the first waiting item, gathers more until `max_batch` are in hand or `max_wait_s`
has passed since the first arrived, and hands the batch to `run(items) -> results` on the
executor: the event loop keeps accepting and decoding requests while the model runs.
Several batchers may share one single-thread executor, which keeps one model copy busy
with one batch at a time.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from typing import Any, Callable, Optional, Sequence


class Batcher:
    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], executor: Executor, max_batch: int, max_wait_s: float,
                 on_batch: Optional[Callable[[int, float], None]] = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.run, self.executor = run, executor
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.on_batch = on_batch  # (batch size, seconds of the forward pass)
        self._queue: Optional[asyncio.Queue] = None
        self._worker: Optional[asyncio.Task] = None

    def start(self) -> None:
        """Start the worker; call from the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Stop the worker; items still waiting fail with RuntimeError."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        while self._queue is not None and not self._queue.empty():
            _fail([self._queue.get_nowait()[1]], RuntimeError("the server is shutting down"))

    async def submit(self, item: Any) -> tuple[Any, int]:
        """(the result for `item`, the size of the batch it ran in): computed together with
        whatever else is waiting."""
        if self._worker is None or self._queue is None:
            raise RuntimeError("the batcher is not running")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((item, future))
        return await future

    async def _gather(self) -> list[tuple[Any, asyncio.Future]]:
        """The next batch: the first item to arrive, then more until full or out of time."""
        assert self._queue is not None
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except asyncio.TimeoutError:
                break
        return [(item, f) for item, f in batch if not f.done()]  # a cancelled caller needs no result

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self.executor, self.run, [item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"the batch function returned {len(results)} results for {len(batch)} items")
            except asyncio.CancelledError:  # stopped mid-batch: nobody is left waiting forever
                _fail([f for _, f in batch], RuntimeError("the server is shutting down"))
                raise
            except Exception as e:  # the callers see the error; the worker carries on
                _fail([f for _, f in batch], e)
                continue
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - started)
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result((result, len(batch)))


def _fail(futures: list[asyncio.Future], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)
