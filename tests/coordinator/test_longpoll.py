"""StampWatch: one reader of a federation's change stamp for every waiting long-poll."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from fedprompt.coordinator.api.longpoll import StampWatch


class FakeStamps:
    """federation_stamp as the service answers it, counting the reads."""

    def __init__(self) -> None:
        self.value: dict[int, tuple[Any, ...]] = {1: ("running", 1, 0), 2: ("waiting", 0, 0)}
        self.reads = 0
        self.lock = threading.Lock()

        self.listeners: list[Any] = []

    def federation_stamp(self, fid: int, max_age: float) -> tuple[Any, ...]:
        with self.lock:
            self.reads += 1
        return self.value[fid]

    def add_change_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def remove_change_listener(self, listener: Any) -> None:
        self.listeners.remove(listener)

    def change(self, fid: int, stamp: tuple[Any, ...]) -> None:
        """A commit (in another thread) announcing the change, as Store.changed does."""
        self.value[fid] = stamp
        for listener in list(self.listeners):
            listener(fid)


def test_many_waiters_share_one_reader_and_all_wake_on_a_change() -> None:
    fake = FakeStamps()
    watch = StampWatch(fake, interval=0.05)  # type: ignore[arg-type]

    async def scenario() -> tuple[list[float], int]:
        seen = await watch.stamp(1)
        reads_before = fake.reads
        waiters = [asyncio.create_task(watch.wait_change(1, seen, timeout=10)) for _ in range(50)]
        await asyncio.sleep(0.5)  # ~10 reader intervals: one read each, not one per waiter
        reads_while_waiting = fake.reads - reads_before
        assert not any(w.done() for w in waiters)
        changed = time.monotonic()
        fake.value[1] = ("running", 1, 1)  # e.g. a version was made
        await asyncio.gather(*waiters)
        return [time.monotonic() - changed], reads_while_waiting

    (woke,), reads = asyncio.run(scenario())
    assert 3 <= reads <= 15, reads  # 50 waiters polling each interval would be ~500
    # woken by the change (a reader interval, 0.05 s, on an idle machine), not by their 10 s timeout;
    # the bound leaves room for a loaded machine
    assert woke < 5
    assert watch._readers == {} and watch._stamps == {}  # the reader stopped with its last waiter


def test_an_announced_change_wakes_the_waiters_before_the_reader_s_interval() -> None:
    fake = FakeStamps()
    watch = StampWatch(fake, interval=60)  # type: ignore[arg-type]  # no timed read during the test

    async def scenario() -> tuple[float, int]:
        seen = await watch.stamp(1)
        waiters = [asyncio.create_task(watch.wait_change(1, seen, timeout=30)) for _ in range(5)]
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waiters) and len(fake.listeners) == 1
        reads = fake.reads
        changed = time.monotonic()
        announcer = threading.Thread(target=fake.change, args=(1, ("running", 1, 1)))
        announcer.start()
        await asyncio.gather(*waiters)
        announcer.join()
        return time.monotonic() - changed, fake.reads - reads

    woke, reads = asyncio.run(scenario())
    assert woke < 20  # the announcement, not the 60 s interval nor the 30 s timeout, ended the wait
    assert reads == 1  # one read of the stamp for all five waiters
    # an announcement after the loop closed unregisters the watch instead of failing the commit
    fake.change(1, ("running", 1, 2))
    assert fake.listeners == []


def test_a_wait_ends_at_its_timeout_and_other_federations_are_separate() -> None:
    fake = FakeStamps()
    watch = StampWatch(fake, interval=0.02)  # type: ignore[arg-type]

    async def scenario() -> tuple[float, bool]:
        one, two = await watch.stamp(1), await watch.stamp(2)
        t0 = time.monotonic()
        waiting_two = asyncio.create_task(watch.wait_change(2, two, timeout=5))
        await watch.wait_change(1, one, timeout=0.2)  # federation 1 never changes
        elapsed = time.monotonic() - t0
        still_waiting = not waiting_two.done()
        fake.value[2] = ("running", 1, 0)
        await asyncio.wait_for(waiting_two, 2)
        return elapsed, still_waiting

    elapsed, still_waiting = asyncio.run(scenario())
    assert 0.2 <= elapsed < 1.0
    assert still_waiting


def test_an_outdated_seen_stamp_returns_at_once() -> None:
    fake = FakeStamps()
    watch = StampWatch(fake, interval=0.05)  # type: ignore[arg-type]

    async def scenario() -> float:
        await watch.stamp(1)
        fake.value[1] = ("running", 2, 1)
        blocker = asyncio.create_task(watch.wait_change(1, ("running", 2, 1), timeout=2))
        await asyncio.sleep(0.2)  # the reader now holds the new stamp
        t0 = time.monotonic()
        await watch.wait_change(1, ("running", 1, 0), timeout=2)
        blocker.cancel()
        return time.monotonic() - t0

    assert asyncio.run(scenario()) < 0.05
