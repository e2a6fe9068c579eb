"""GroupCommit: concurrent items written in batches, each caller gets its own answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from fedprompt.coordinator.persistence.groupcommit import GroupCommit


def test_concurrent_items_are_batched_and_each_caller_gets_its_own_result() -> None:
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int | BaseException]:
        batches.append(list(items))
        time.sleep(0.05)  # a transaction: others arrive meanwhile
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    gc: GroupCommit[int, int] = GroupCommit(write)
    answers: dict[int, object] = {}

    def call(i: int) -> None:
        try:
            answers[i] = gc.submit(i)
        except ValueError as exc:
            answers[i] = str(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers == {i: (f"odd {i}" if i % 2 else i * 10) for i in range(40)}
    assert sorted(i for b in batches for i in b) == list(range(40))  # each item written once
    assert len(batches) < 40  # and together: most batches held several items
    assert max(len(b) for b in batches) > 1


def test_a_failing_batch_fails_each_of_its_callers_and_the_next_batch_runs() -> None:
    calls = []

    def write(items: Sequence[str]) -> list[str | BaseException]:
        calls.append(list(items))
        if "boom" in items:
            raise RuntimeError("database is gone")
        return [x.upper() for x in items]

    gc: GroupCommit[str, str] = GroupCommit(write)
    with pytest.raises(RuntimeError, match="database is gone"):
        gc.submit("boom")
    assert gc.submit("fine") == "FINE"  # the lock was released, nothing is stuck
    assert calls == [["boom"], ["fine"]]


def test_a_short_answer_is_an_error_not_a_silent_success() -> None:
    gc: GroupCommit[int, int] = GroupCommit(lambda items: [])
    with pytest.raises(RuntimeError, match="answered 0 of 1"):
        gc.submit(1)


def test_a_batch_refused_by_a_unique_constraint_is_written_one_by_one() -> None:
    from fedprompt.coordinator.persistence.groupcommit import one_by_one_on_conflict
    from sqlalchemy.exc import IntegrityError

    taken = {3}  # stored by another process meanwhile
    calls: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int | BaseException]:
        calls.append(list(items))
        if taken & set(items):
            raise IntegrityError("INSERT", {}, Exception("unique"))
        return [i * 10 for i in items]

    out = one_by_one_on_conflict(write, [1, 3, 5])
    assert out[0] == 10 and out[2] == 50 and isinstance(out[1], IntegrityError)
    assert calls == [[1, 3, 5], [1], [3], [5]]
    assert isinstance(one_by_one_on_conflict(write, [3])[0], IntegrityError)
    assert one_by_one_on_conflict(write, [2, 4]) == [20, 40]
