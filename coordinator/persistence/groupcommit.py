"""Group commit: concurrent callers' items written by one of them in a single transaction.

Each upload used to be its own transaction. On SQLite, where one transaction writes at a time,
that caps uploads at one per (begin + checks + insert + commit); a thousand clients uploading
within seconds queue for seconds. Here a caller hands its item over and waits; whichever caller
finds no batch being written takes every item waiting (its own included) and writes them all with
one `write_batch` call, then wakes the others with their results; a caller whose item arrived
while a batch was being written leads the next one. Each item still gets its own answer: a result,
or the exception `write_batch` gave for it. Nothing is acknowledged before its batch committed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio.to_thread
from sqlalchemy.exc import IntegrityError

T = TypeVar("T")
R = TypeVar("R")
B = TypeVar("B")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    """Batches items of concurrent `submit` calls into `write_batch` calls, one at a time.

    `write_batch(items)` returns one entry per item, in order: its result, or the exception to raise
    in its caller. If `write_batch` itself raises, every caller of that batch gets the exception.
    """

    def __init__(self, write_batch: Callable[[Sequence[T]], Sequence[R | BaseException]]) -> None:
        self._write_batch = write_batch
        self._cond = threading.Condition()
        self._waiting: list[_Slot[T, R]] = []
        self._writing = False

    def submit(self, item: T) -> R:
        """Write `item` (with whatever else is waiting) and return its result once committed."""
        slot: _Slot[T, R] = _Slot(item)
        with self._cond:
            self._waiting.append(slot)
            while self._writing and not slot.done:
                self._cond.wait()
            if not slot.done:  # nobody is writing: lead a batch of everything waiting
                self._writing = True
                batch, self._waiting = self._waiting, []
        if not slot.done:
            try:
                outcomes: Sequence[R | BaseException] = self._write_batch([s.item for s in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"write_batch answered {len(outcomes)} of {len(batch)} items")
            except BaseException as exc:  # every caller of the batch gets it
                outcomes = [exc] * len(batch)
            with self._cond:
                for s, outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        s.error = outcome
                    else:
                        s.result = outcome
                    s.done = True
                self._writing = False
                self._cond.notify_all()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]  # set by the committer wherever error is not


class AsyncBatcher(Generic[T, R]):
    """GroupCommit for callers on an event loop, who wait on the loop, not in a thread: concurrent
    callers' items handled by one `write_batch` call in a worker thread, each with its own answer.

    A request thread that waits for its batch holds the thread: with FEDPROMPT_THREADS of them, a
    batch held at most that many items, and the task polls that need a query queued behind the
    waiting ones. Here the items of one event loop that arrive while a batch is being handled wait
    as futures and form the next batch (each loop keeps its own queue: a test client may run
    requests on loops of their own). Evaluation reports are committed this way, and the task polls
    that wake together when a round opens are answered this way (one read for the batch).
    `write_batch` answers as for GroupCommit.
    """

    def __init__(self, write_batch: Callable[[Sequence[T]], Sequence[R | BaseException]]) -> None:
        self._write_batch = write_batch
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopQueue[T, R]] = (
            weakref.WeakKeyDictionary()
        )

    async def submit(self, item: T) -> R:
        """Write `item` (with whatever else waits on this loop) and return its result once committed.

        The batch is written by a task of its own: a caller cancelled meanwhile (its client went
        away) leaves the others' answers, and its own item's write, as they were."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _LoopQueue()
        future: asyncio.Future[R] = loop.create_future()
        queue.waiting.append((item, future))
        try:
            while not future.done():
                if queue.writing is None:  # nobody writes: a batch of everything waiting
                    batch, queue.waiting = queue.waiting, []
                    queue.writing = loop.create_task(self._write(queue, batch))
                await asyncio.wait((future, queue.writing), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            future.cancel()  # its batch skips it (the item itself is written all the same)
            raise
        return future.result()

    async def _write(self, queue: _LoopQueue[T, R], batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            outcomes = await anyio.to_thread.run_sync(self._write_batch, [item for item, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"write_batch answered {len(outcomes)} of {len(batch)} items")
        except BaseException as exc:  # every caller of the batch gets it
            outcomes = [exc] * len(batch)
        finally:
            queue.writing = None  # whoever waits next leads the next batch
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


class _LoopQueue(Generic[T, R]):
    __slots__ = ("waiting", "writing")

    def __init__(self) -> None:
        self.waiting: list[tuple[T, asyncio.Future[R]]] = []
        self.writing: asyncio.Task[None] | None = None  # the batch being written


def one_by_one_on_conflict(
    write: Callable[[Sequence[T]], Sequence[R | BaseException]], items: Sequence[T]
) -> list[R | BaseException]:
    """A `write_batch` that writes the batch in one transaction, unless a unique constraint refuses
    it (another process stored one of these clients' items meanwhile): then each item on its own, so
    that only the conflicting one answers with the IntegrityError."""
    try:
        return list(write(items))
    except IntegrityError as exc:
        if len(items) == 1:
            return [exc]
    out: list[R | BaseException] = []
    for item in items:
        try:
            out.extend(write([item]))
        except IntegrityError as exc:
            out.append(exc)
    return out


class PerFederation(Generic[B]):
    """One batcher (GroupCommit or AsyncBatcher) a federation, made on its first use, whose batches
    `write_batch(fid, items)` writes in one transaction (one_by_one_on_conflict)."""

    def __init__(
        self,
        kind: Callable[[Callable[[Sequence[Any]], Sequence[Any]]], B],
        write_batch: Callable[[int, Sequence[Any]], Sequence[Any]],
    ) -> None:
        self._kind, self._write_batch = kind, write_batch
        self._batchers: dict[int, B] = {}

    def __getitem__(self, fid: int) -> B:
        batcher = self._batchers.get(fid)
        if batcher is None:
            write = functools.partial(one_by_one_on_conflict, functools.partial(self._write_batch, fid))
            batcher = self._batchers.setdefault(fid, self._kind(write))
        return batcher
