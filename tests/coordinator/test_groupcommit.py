"""GroupCommit: concurrent items written in batches, each caller gets its own answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest
from fedprompt.coordinator.persistence.groupcommit import AsyncBatcher, GroupCommit


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


def test_each_federation_has_one_batcher_of_its_own_whose_batches_carry_its_id() -> None:
    from fedprompt.coordinator.persistence.groupcommit import PerFederation

    written: list[tuple[int, list[int]]] = []

    def write(fid: int, items: Sequence[int]) -> list[int | BaseException]:
        written.append((fid, list(items)))
        return [fid * 100 + i for i in items]

    batchers: PerFederation[GroupCommit[int, int]] = PerFederation(GroupCommit, write)
    assert batchers[7] is batchers[7] and batchers[7] is not batchers[8]
    assert batchers[7].submit(1) == 701 and batchers[8].submit(2) == 802
    assert written == [(7, [1]), (8, [2])]


def test_async_items_of_one_loop_are_batched_beyond_any_thread_count() -> None:
    batches: list[list[int]] = []

    def write(items: Sequence[int]) -> list[int | BaseException]:
        batches.append(list(items))
        time.sleep(0.05)  # a transaction, in a worker thread: the loop queues the next batch meanwhile
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]

    gc: AsyncBatcher[int, int] = AsyncBatcher(write)

    async def call(i: int) -> object:
        try:
            return await gc.submit(i)
        except ValueError as exc:
            return str(exc)

    async def main() -> list[object]:
        return list(await asyncio.gather(*(call(i) for i in range(100))))

    answers = asyncio.run(main())
    assert answers == [f"odd {i}" if i % 2 else i * 10 for i in range(100)]
    assert sorted(i for b in batches for i in b) == list(range(100))  # each item written once
    assert batches[0] == [0] and batches[1] == list(range(1, 100))  # the rest waited as one batch


def test_async_a_failing_batch_fails_its_callers_and_a_cancelled_caller_leaves_the_others() -> None:
    calls: list[list[str]] = []
    release = threading.Event()

    def write(items: Sequence[str]) -> list[str | BaseException]:
        calls.append(list(items))
        if "slow" in items:
            release.wait(5)
        if "boom" in items:
            raise RuntimeError("database is gone")
        return [x.upper() for x in items]

    gc: AsyncBatcher[str, str] = AsyncBatcher(write)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="database is gone"):
            await gc.submit("boom")
        assert await gc.submit("fine") == "FINE"  # nothing is stuck
        slow = asyncio.ensure_future(gc.submit("slow"))  # leads a batch that takes a while
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(gc.submit(x)) for x in ("a", "b")]
        await asyncio.sleep(0.05)
        slow.cancel()  # its client went away: its batch is still written, the others still answered
        release.set()
        assert await asyncio.gather(*waiting) == ["A", "B"]
        with pytest.raises(asyncio.CancelledError):
            await slow

    asyncio.run(main())
    assert calls == [["boom"], ["fine"], ["slow"], ["a", "b"]]


def test_async_a_short_answer_is_an_error_not_a_silent_success() -> None:
    gc: AsyncBatcher[int, int] = AsyncBatcher(lambda items: [])
    with pytest.raises(RuntimeError, match="answered 0 of 1"):
        asyncio.run(gc.submit(1))
