"""Training slots across processes and the thread share they imply (worker/slots.py)."""

from __future__ import annotations

import multiprocessing as mp
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedprompt.worker.slots import ElasticThreads, held_slots, share_of, training_slot


def test_share_of_divides_the_budget_and_keeps_the_floor() -> None:
    assert share_of(2, 1, 1) == 2
    assert share_of(2, 2, 1) == 1
    assert share_of(8, 3, 1) == 2
    assert share_of(2, 5, 1) == 1
    assert share_of(4, 0, 1) == 4  # nobody holds a slot yet: the whole budget
    assert share_of(4, 4, 2) == 2


@contextmanager
def _held_by_another_thread(directory: Path, slots: int) -> Iterator[None]:
    """One slot held by another thread (a second trainer) until the block ends."""
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with training_slot(directory, slots):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    try:
        yield
    finally:
        release.set()
        t.join(10)


def test_held_slots_counts_locks_held_here_and_in_another_thread(tmp_path: Path) -> None:
    assert held_slots(tmp_path, 3) == 0  # no lock files yet
    with _held_by_another_thread(tmp_path, 3):
        with training_slot(tmp_path, 3) as mine:
            assert mine in (0, 1, 2)
            assert held_slots(tmp_path, 3) == 2
        assert held_slots(tmp_path, 3) == 1
    assert held_slots(tmp_path, 3) == 0


def _hold(directory: str, ready: mp.synchronize.Event, done: mp.synchronize.Event) -> None:
    with training_slot(Path(directory), 2):
        ready.set()
        done.wait(20)


def test_held_slots_sees_a_slot_held_by_another_process(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path), ready, done))
    proc.start()
    try:
        assert ready.wait(30)
        assert held_slots(tmp_path, 2) == 1
        with training_slot(tmp_path, 2) as mine:
            assert mine in (0, 1)
            assert held_slots(tmp_path, 2) == 2
    finally:
        done.set()
        proc.join(30)
    assert held_slots(tmp_path, 2) == 0


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_elastic_threads_follow_the_trainers_and_restore_the_floor(tmp_path: Path) -> None:
    calls: list[int] = []
    clock = _Clock()
    with training_slot(tmp_path, 2):
        elastic = ElasticThreads(tmp_path, 2, 2, 1, calls.append, every_s=2.0, clock=clock)
        with elastic:
            assert elastic.threads == 2 and calls == [2]  # alone: both cores
            with _held_by_another_thread(tmp_path, 2):
                clock.now = 1.0
                assert elastic.adjust() == 2 and calls == [2]  # re-read at most every 2 s
                clock.now = 2.5
                assert elastic.adjust() == 1 and calls == [2, 1]  # a second trainer: one core each
            clock.now = 5.0
            assert elastic.adjust() == 2 and calls == [2, 1, 2]
        assert calls == [2, 1, 2, 1]  # back to the process's own thread count
        assert elastic.threads == 1


def test_elastic_threads_do_nothing_without_a_budget_or_slots(tmp_path: Path) -> None:
    calls: list[int] = []
    for elastic in (
        ElasticThreads(tmp_path, 2, None, 1, calls.append),
        ElasticThreads(None, 2, 4, 1, calls.append),
        ElasticThreads(tmp_path, 0, 4, 1, calls.append),
        ElasticThreads(tmp_path, 2, 1, 1, calls.append),  # a budget no larger than the floor
    ):
        with elastic:
            assert elastic.adjust(force=True) == 1
    assert calls == []
