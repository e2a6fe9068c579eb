"""A cross-process limit on concurrent training: N lock files, one held per training worker.

The slots also say how many trainers are running at once, which lets a trainer size its torch
thread pool: a pool process whose two selected clients train one after another, while the other
processes have nothing to train, would otherwise leave cores idle (`ElasticThreads`).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def training_slot(directory: Path | None, slots: int, stop: threading.Event | None = None) -> Iterator[int]:
    """Hold one of `slots` file locks in `directory` (no-op when directory is None); waits for a free one."""
    if directory is None or slots <= 0:
        yield -1
        return
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(slots):
            fd = os.open(directory / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield i
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        if stop is not None and stop.is_set():
            raise InterruptedError("stopping while waiting for a training slot")
        time.sleep(0.2)


def held_slots(directory: Path, slots: int) -> int:
    """How many of the `slots` locks are held right now, by any process (the caller's own included).

    Each free lock is taken and given back at once to find out, so a trainer looking for a slot at
    that instant may miss it and try again 0.2 s later."""
    held = 0
    for i in range(slots):
        try:
            fd = os.open(directory / f"slot-{i}.lock", os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held += 1
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return held


def share_of(budget: int, trainers: int, floor: int) -> int:
    """A trainer's threads when `trainers` share `budget` cores: an equal share, never below `floor`."""
    return max(floor, budget // max(1, trainers))


class ElasticThreads:
    """Torch threads for one slot holder: `budget` cores shared equally by the trainers holding slots.

    `adjust()` (at the start of training and then from the step callback, at most every `every_s`)
    sets the share for the trainers running now; leaving the block sets `floor` again, the thread
    count the process was started with. Without a slot directory or budget it does nothing.
    """

    def __init__(
        self,
        directory: Path | None,
        slots: int,
        budget: int | None,
        floor: int,
        set_threads: Callable[[int], None],
        *,
        every_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = directory is not None and slots > 0 and budget is not None and budget > floor
        self.directory, self.slots, self.budget, self.floor = directory, slots, budget or floor, floor
        self.set_threads, self.every_s, self.clock = set_threads, every_s, clock
        self.threads = floor
        self._checked = -float("inf")

    def adjust(self, *, force: bool = False) -> int:
        """Re-read the trainers and set this one's share if it changed; returns the threads in use."""
        if not self.enabled or (not force and self.clock() - self._checked < self.every_s):
            return self.threads
        assert self.directory is not None
        self._checked = self.clock()
        want = share_of(self.budget, held_slots(self.directory, self.slots), self.floor)
        if want != self.threads:
            self.set_threads(want)
            self.threads = want
        return self.threads

    def __enter__(self) -> ElasticThreads:
        self.adjust(force=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self.threads != self.floor:
            self.set_threads(self.floor)
            self.threads = self.floor
