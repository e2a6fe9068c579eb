"""Long-polling of a client's next task: one reader of a federation's change stamp for all the task
polls waiting on it.

A waiting poll used to wake every FEDPROMPT_LONG_POLL_INTERVAL_S to look at the stamp; with a
thousand clients waiting that is thousands of wake-ups a second on the event loop. Here, while any
poll waits on a federation, a single task reads its stamp (`Store.federation_stamp`, shared
with the other requests of this process) and wakes the waiting polls only when it changed; a poll
otherwise sleeps until its deadline. The reader looks at once when the store announces a change of
the federation (a commit of this process, or another's NOTIFY on Postgres) and otherwise every
interval, so a missed announcement delays a task by one interval at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fedprompt.coordinator.api.perloop import PerLoop
from fedprompt.coordinator.persistence.db import Client
from fedprompt.coordinator.persistence.groupcommit import AsyncBatcher
from fedprompt.coordinator.persistence.store import Stamp, Store
from fedprompt.coordinator.service import Coordinator

log = logging.getLogger("fedprompt.coordinator")


class StampWatch:
    """Change stamps of the federations that long-polls wait on (one event loop's)."""

    def __init__(self, store: Store, interval: float) -> None:
        self.store, self.interval = store, interval
        self._stamps: dict[int, Stamp] = {}  # the last stamp each running reader saw
        self._changed: dict[int, asyncio.Event] = {}  # set (and replaced) when a stamp changes
        self._poked: dict[int, asyncio.Event] = {}  # set when the store announces a change
        self._waiting: Counter[int] = Counter()
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its readers run on, once one has

    def _listen(self) -> None:
        """On the first reader: hear the store's announcements on this loop."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self.store.add_change_listener(self._announced)

    def _announced(self, fid: int) -> None:
        """The store's change listener (called in any thread): have fid's reader look now."""
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._poke, fid)
        except RuntimeError:  # the loop closed: nothing waits here any more
            self.store.remove_change_listener(self._announced)

    def _poke(self, fid: int) -> None:
        poke = self._poked.get(fid)
        if poke is not None:
            poke.set()

    async def stamp(self, fid: int) -> Stamp:
        """The federation's current stamp: the reader's if one runs, else read now."""
        if fid in self._readers and fid in self._stamps:
            return self._stamps[fid]
        return await run_in_threadpool(self.store.federation_stamp, fid, self.interval)

    async def wait_change(self, fid: int, seen: Stamp, timeout: float) -> None:
        """Return once the federation's stamp is no longer `seen`, or after `timeout` seconds."""
        self._waiting[fid] += 1
        try:
            self._stamps.setdefault(fid, seen)
            if fid not in self._readers:
                self._listen()
                self._readers[fid] = asyncio.create_task(self._read(fid))
            while self._stamps.get(fid) == seen:
                event = self._changed.setdefault(fid, asyncio.Event())
                await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return
        finally:
            self._waiting[fid] -= 1
            if self._waiting[fid] <= 0:
                del self._waiting[fid]

    async def _read(self, fid: int) -> None:
        try:
            poke = self._poked.setdefault(fid, asyncio.Event())
            while self._waiting[fid] > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(poke.wait(), self.interval)
                poke.clear()  # an announcement during the read below sets it again
                try:
                    stamp = await run_in_threadpool(self.store.federation_stamp, fid, self.interval)
                except Exception:  # a transient database error: the polls wait on, as they would
                    log.exception("reading the change stamp of federation %s failed", fid)
                    continue
                if stamp != self._stamps.get(fid):
                    self._stamps[fid] = stamp
                    event = self._changed.pop(fid, None)
                    if event is not None:
                        event.set()
        finally:  # no poll waits any more (or the loop is shutting down)
            self._readers.pop(fid, None)
            self._stamps.pop(fid, None)
            self._poked.pop(fid, None)


class TaskPoll:
    """The task long-poll of one app: a client's next task, waiting up to `max_wait` seconds for one.

    Records the poll as the client's heartbeat (when due), then asks the service for a task each
    time the federation's stamp changes, and otherwise sleeps until it does or the wait is over.
    Its StampWatch is its event loop's (perloop.py)."""

    def __init__(self, service: Coordinator, interval: float, max_wait: float) -> None:
        self.service, self.max_wait = service, max_wait
        self.watches: PerLoop[StampWatch] = PerLoop(lambda: StampWatch(service.store, interval))
        # fid -> its polls' batches: those that wake together are answered by one call (Tasks.next_tasks_at)
        self._batches: dict[int, AsyncBatcher[tuple[Client, Stamp], dict[str, Any] | None]] = {}

    def _batcher(self, fid: int) -> AsyncBatcher[tuple[Client, Stamp], dict[str, Any] | None]:
        batcher = self._batches.get(fid)
        if batcher is None:
            tasks = self.service.tasks
            batcher = self._batches.setdefault(fid, AsyncBatcher(functools.partial(tasks.next_tasks_at, fid)))
        return batcher

    async def next_task(self, fid: int, client: Client, wait: float) -> dict[str, Any] | None:
        """The client's next task, or None when none came within `wait` seconds (at most max_wait)."""
        deadline = time.monotonic() + min(wait, self.max_wait)
        if self.service.enrolment.heartbeat_due(client):
            await run_in_threadpool(self.service.enrolment.heartbeat, client)
        watch = self.watches.get()
        seen = None
        while True:
            stamp = await watch.stamp(fid)
            if stamp != seen:  # only a change of the federation can bring this client a new task
                tasks = self.service.tasks
                if tasks.idle.idle(fid, stamp, client.id):  # nothing under this stamp: no thread, no query
                    found = None
                else:
                    found = await self._batcher(fid).submit((client, stamp))
                if found is not None:
                    return found
                seen = stamp
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await watch.wait_change(fid, seen, remaining)
