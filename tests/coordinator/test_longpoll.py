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

    def federation_stamp(self, fid: int, max_age: float) -> tuple[Any, ...]:
        with self.lock:
            self.reads += 1
        return self.value[fid]


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
