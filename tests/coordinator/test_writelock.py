"""WriteLock: re-entrant, and urgent writers overtake the others waiting."""

from __future__ import annotations

import threading
import time

from fedprompt.coordinator.persistence.writelock import WriteLock


def _waiter(lock: WriteLock, name: str, urgent: bool, order: list[str], started: threading.Event) -> None:
    started.set()
    with lock.hold(urgent=urgent):
        order.append(name)


def test_an_urgent_writer_overtakes_the_writers_already_waiting() -> None:
    for _ in range(5):  # the waiters wake in no set order: without priority, "upload" wins 1 in 3
        lock, order = WriteLock(), []
        threads = []
        with lock.hold():
            for name, urgent in [("evaluation-1", False), ("evaluation-2", False), ("upload", True)]:
                started = threading.Event()
                t = threading.Thread(target=_waiter, args=(lock, name, urgent, order, started))
                t.start()
                started.wait()
                time.sleep(0.03)  # let it block on the lock
                threads.append(t)
            assert order == []  # all wait while the lock is held
        for t in threads:
            t.join(5)
        assert order[0] == "upload"
        assert sorted(order[1:]) == ["evaluation-1", "evaluation-2"]


def test_the_lock_is_reentrant_and_exclusive() -> None:
    lock, inside, peak = WriteLock(), [0], [0]

    def work() -> None:
        for _ in range(200):
            with lock.hold(), lock.hold(urgent=True):  # nested in one thread: no deadlock
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 1 and not any(t.is_alive() for t in threads)
