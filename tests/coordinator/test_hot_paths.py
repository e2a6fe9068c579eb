"""The coordinator's hot paths: evaluation reports committed in groups, downloads written behind,
polls with nothing new answered without a query, and a commit that changes a federation announced to
this process's long-polls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fedprompt.coordinator.errors import Forbidden, NotFound
from fedprompt.coordinator.logic.evaluation import PendingReport, check_reports
from fedprompt.coordinator.persistence.db import Evaluation, Federation, Participant
from fedprompt.coordinator.persistence.downloadlog import DownloadLog
from fedprompt.coordinator.service import Coordinator
from fedprompt.coordinator.usecases.board import IdleClients
from fedprompt.shared.spec import FederationSpec
from sqlalchemy import event, select

from tests.helpers import SMALL_SPEC, report, update_blob


def _update(service: Coordinator, fid: int) -> bytes:
    return update_blob(service.store.cached_spec(fid), 1, base_version=0)


def _report(version: int, client_id: int) -> PendingReport:
    return PendingReport(version, client_id, num_samples=5, accuracy=0.5, loss=None, metrics={})


def test_check_reports_answers_each_report_of_a_batch() -> None:
    stored = {(1, 7)}
    items = [_report(1, 7), _report(2, 8), _report(1, 9), _report(3, 8), _report(1, 5), _report(1, 9)]
    out = check_reports(items, latest=2, revoked={5}, stored=stored)
    assert out[0] is False  # reported before: a repeat
    assert out[1] is True and out[2] is True
    assert isinstance(out[3], NotFound) and "latest is 2" in str(out[3])
    assert isinstance(out[4], Forbidden) and "client 5 was revoked" in str(out[4])
    assert out[5] is False  # the same pair twice in one batch: the second is a repeat
    assert stored == {(1, 7), (2, 8), (1, 9)}
    assert isinstance(check_reports([_report(-1, 1)], 0, set(), set())[0], NotFound)


def test_idle_marks_hold_only_under_the_stamp_they_were_made_under() -> None:
    idle = IdleClients()
    idle.mark(1, ("running", 1, 0), 10, idle.generation(1))
    idle.mark(1, ("running", 1, 0), 11, idle.generation(1))
    assert idle.idle(1, ("running", 1, 0), 10) and idle.idle(1, ("running", 1, 0), 11)
    assert not idle.idle(1, ("running", 1, 0), 12)
    assert not idle.idle(2, ("running", 1, 0), 10)  # another federation
    assert not idle.idle(1, ("running", 2, 1), 10)  # the federation moved on
    idle.mark(1, ("running", 2, 1), 12, idle.generation(1))  # a mark under the new stamp drops the old ones
    assert not idle.idle(1, ("running", 1, 0), 10) and idle.idle(1, ("running", 2, 1), 12)
    # an announced change drops the marks even where the stamp came back the same (a clock that
    # stood still), and voids a mark of a query that ran across it
    before = idle.generation(1)
    idle.forget(1)
    assert not idle.idle(1, ("running", 2, 1), 12)
    idle.mark(1, ("running", 2, 1), 12, before)
    assert not idle.idle(1, ("running", 2, 1), 12)
    idle.mark(2, ("running", 2, 1), 12, idle.generation(2))  # other federations keep theirs
    idle.forget(1)
    assert idle.idle(2, ("running", 2, 1), 12)


def _federation(service: Coordinator, n: int, **overrides: Any) -> tuple[int, list[Any]]:
    spec = FederationSpec.model_validate({**SMALL_SPEC, "min_clients": n, "fraction": 1.0, **overrides})
    fid = service.federations.create_federation(spec).id
    token, _ = service.enrolment.create_enrollment_token(fid)
    clients = [
        service.enrolment.enroll(fid, token, name=f"c{i}", num_samples=10, info={})[0] for i in range(n)
    ]
    service.cycle.sweep()  # round 1 opens with every client
    return fid, clients


@contextmanager
def _statements(service: Coordinator) -> Iterator[list[str]]:
    seen: list[str] = []
    engine = service.store.sessions.kw["bind"]

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def test_a_poll_with_nothing_new_runs_no_query_until_the_federation_changes(service: Coordinator) -> None:
    fid, (a, b) = _federation(service, 2)
    tasks, store = service.tasks, service.store
    stamp = store.federation_stamp(fid, 60)
    for c in (a, b):  # version 0's evaluation first
        assert tasks.next_task_at(fid, c, stamp)["kind"] == "evaluate"
        report(service, fid, 0, c, {"num_samples": 5, "accuracy": 0.5})
    assert tasks.next_task_at(fid, a, stamp)["kind"] == "train"
    tasks.idle.mark(fid, stamp, a.id, tasks.idle.generation(fid))  # as after a's upload: nothing found
    with _statements(service) as seen:
        assert tasks.next_task_at(fid, a, stamp) is None
    assert seen == []
    # a change of the federation's row, committed here, moves the stamp: the mark no longer holds
    with store.tx() as s:
        store.lock_federation(s, fid).updated_at = store.clock() + 1
    assert store.federation_stamp(fid, 60) != stamp  # the cached stamp was forgotten at the commit
    with _statements(service) as seen:
        assert tasks.next_task_at(fid, a, store.federation_stamp(fid, 60))["kind"] == "train"
    assert seen


def test_a_commit_that_changes_a_federation_is_announced_once_it_committed(service: Coordinator) -> None:
    fid, _ = _federation(service, 1)
    heard: list[tuple[int, bool]] = []
    store = service.store

    def listener(changed: int) -> None:  # sees the committed row (a fresh session)
        with store.sessions() as s:
            heard.append(
                (changed, s.scalar(select(Federation.updated_at).where(Federation.id == changed)) == 12345.0)
            )

    store.add_change_listener(listener)
    with pytest.raises(RuntimeError), store.tx() as s:
        store.lock_federation(s, fid).updated_at = 999.0
        s.flush()
        raise RuntimeError("rolled back")
    assert heard == []  # nothing announced for a rolled-back change
    with store.tx() as s:
        store.lock_federation(s, fid).updated_at = 12345.0
    assert heard == [(fid, True)]
    with store.tx() as s:  # a transaction that does not change the row announces nothing
        store.lock_federation(s, fid)
    store.remove_change_listener(listener)
    assert heard == [(fid, True)]


def test_concurrent_evaluation_reports_are_each_answered_and_stored_once(service: Coordinator) -> None:
    fid, clients = _federation(service, 12)
    service.enrolment.revoke_client(fid, clients[3].id)
    batches: list[int] = []
    store_reports = service.uploads._store_reports

    def counted(fid: int, items: Any) -> Any:
        batches.append(len(items))
        return store_reports(fid, items)

    service.uploads._store_reports = counted  # type: ignore[method-assign]

    async def report_all() -> list[object]:
        async def one(i: int) -> object:
            try:
                return await service.uploads.report_evaluation(
                    fid, 0, clients[i % 12], {"num_samples": 5 + i % 12, "accuracy": 0.5}
                )
            except Forbidden as exc:
                return str(exc)

        return list(await asyncio.gather(*(one(i) for i in range(24))))  # each client twice

    answers = dict(enumerate(asyncio.run(report_all())))
    assert sum(batches) < 2 * 24 and max(batches) > 8  # batched beyond the request threads' count
    per_client: dict[int, list[object]] = {}
    for i, answer in answers.items():
        per_client.setdefault(i % 12, []).append(answer)
    assert per_client[3] == [f"client {clients[3].id} was revoked by the operator"] * 2
    for i in set(range(12)) - {3}:
        assert sorted(per_client[i], key=str) == [False, True]  # stored once; the other a repeat
    with service.store.sessions() as s:
        rows = s.execute(select(Evaluation.client_id, Evaluation.num_samples)).all()
    assert sorted(rows) == sorted((c.id, 5 + i) for i, c in enumerate(clients) if i != 3)


def test_downloaded_bytes_are_written_behind_and_only_grow(service: Coordinator) -> None:
    fid, (a, b) = _federation(service, 2)
    with service.store.sessions() as s:
        parts = dict(s.execute(select(Participant.client_id, Participant.id)).all())
    log = DownloadLog(service.store.tx, flush_after_s=3600, flush_at=3)

    def figures() -> dict[int, int]:
        with service.store.sessions() as s:
            return dict(s.execute(select(Participant.id, Participant.downloaded_bytes)).all())

    log.record(parts[a.id], 100)
    log.record(parts[a.id], 60)  # smaller: the larger figure stays
    log.record(parts[b.id], 80)
    assert figures() == {parts[a.id]: 0, parts[b.id]: 0} and log.pending() == 2  # held, not written
    log.flush()
    assert figures() == {parts[a.id]: 100, parts[b.id]: 80} and log.pending() == 0
    log.record(parts[a.id], 90)  # below the stored figure: a flush leaves it
    log.flush()
    assert figures()[parts[a.id]] == 100
    for size in (120, 130):  # flush_at=3 distinct figures: the third record writes them
        log.record(parts[b.id], size)
    log.record(parts[a.id], 150)
    assert log.pending() == 2
    log.record(10_000, 1)  # a third participant id: due
    assert log.pending() == 0 and figures() == {parts[a.id]: 150, parts[b.id]: 130}


def test_a_failed_flush_keeps_the_figures_for_the_next(service: Coordinator) -> None:
    fid, (a,) = _federation(service, 1)
    with service.store.sessions() as s:
        part = s.scalar(select(Participant.id))
    fail = [True]

    @contextmanager
    def tx() -> Iterator[Any]:
        with service.store.tx() as s:
            if fail[0]:
                raise ConnectionError("the database went away")
            yield s

    log = DownloadLog(tx, flush_after_s=3600)
    log.record(part, 42)
    with pytest.raises(ConnectionError):
        log.flush()
    assert log.pending() == 1
    fail[0] = False
    log.flush()
    with service.store.sessions() as s:
        assert s.scalar(select(Participant.downloaded_bytes).where(Participant.id == part)) == 42


def test_the_board_answers_as_next_task_does_with_one_query_per_task_found(service: Coordinator) -> None:
    fid, clients = _federation(service, 3, evaluators=2)
    tasks, store = service.tasks, service.store

    def both(c: Any) -> tuple[Any, Any]:
        return tasks.next_task_at(fid, c, store.federation_stamp(fid, 0)), tasks.next_task(fid, c)

    a, b, c = clients
    for client in clients:  # version 0: the first two clients evaluate it, the third trains at once
        got, expected = both(client)
        assert got == expected
    assert both(a)[0]["kind"] == "evaluate" and both(c)[0]["kind"] == "train"
    report(service, fid, 0, a, {"num_samples": 5, "accuracy": 0.5})
    with _statements(service) as seen:  # the board learnt a's report at its commit: no query for it
        got = tasks.next_task_at(fid, a, store.federation_stamp(fid, 60))
    assert got == tasks.next_task(fid, a) and got["kind"] == "train"
    selects = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 1  # its upload (pending) checked, nothing else
    with _statements(service) as seen:  # a participant's download counts without a lookup
        tasks.get_prompt(fid, got["version"], client=a)
    assert not any("participant" in q.lower() for q in seen)
    store.downloads.flush()
    with store.sessions() as s:
        assert s.scalar(select(Participant.downloaded_bytes).where(Participant.client_id == a.id)) > 0
    service.enrolment.revoke_client(fid, b.id)  # revoked: the board no longer holds it, next_task answers
    assert tasks.next_task_at(fid, b, store.federation_stamp(fid, 0)) == tasks.next_task(fid, b)


def test_polls_that_wake_together_are_answered_as_next_task_does_with_one_query_per_kind(
    service: Coordinator,
) -> None:
    fid, clients = _federation(service, 8, evaluators=6)
    tasks, store = service.tasks, service.store
    for c in clients[:3]:  # three reported version 0; of these, one has uploaded too
        report(service, fid, 0, c, {"num_samples": 5, "accuracy": 0.5})
    service.uploads.upload(fid, 1, clients[0], _update(service, fid))
    service.enrolment.revoke_client(fid, clients[7].id)
    tasks._changed(fid)  # a fresh board and no marks: as a process that learnt none of it
    stamp = store.federation_stamp(fid, 0)
    expected = [tasks.next_task(fid, c) for c in clients]
    assert [t and t["kind"] for t in expected] == [
        None,
        "train",
        "train",
        *["evaluate"] * 3,
        "train",
        "train",
    ]
    tasks._changed(fid)
    tasks._board(fid, stamp, tasks.idle.generation(fid))  # the board, read once per change
    with _statements(service) as seen:
        got = tasks.next_tasks_at(fid, [(c, stamp) for c in clients])
    assert got[:7] == expected[:7]
    # the revoked client is no longer on the board: answered by next_task, alone
    assert got[7] == tasks.next_task(fid, clients[7])
    selects = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    evaluated = [q for q in selects if "evaluations" in q.lower() and " in " in q.lower()]
    pending = [q for q in selects if "participants" in q.lower() and " in " in q.lower()]
    assert len(evaluated) == 1 and len(pending) == 1  # one query per kind for the whole batch
    assert len(selects) < len(clients)
    # client 0 found nothing: marked idle, so its next poll under this stamp asks nothing
    assert tasks.idle.idle(fid, stamp, clients[0].id)
    with _statements(service) as seen:
        assert tasks.next_tasks_at(fid, [(clients[0], stamp)]) == [None]
    assert seen == []


def test_a_request_asks_no_telemetry_provider(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """FastAPI's OpenTelemetry hooks are off: serving a request never asks the global tracer, meter or
    logger provider (each of which read the environment on every request while the hooks were on)."""
    pytest.importorskip("fastapi.telemetry", reason="a FastAPI release without its own telemetry hooks")
    import opentelemetry._logs as otel_logs
    from opentelemetry import metrics, trace

    asked: list[str] = []
    for module, name in ((trace, "get_tracer_provider"), (metrics, "get_meter_provider")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda real=real, name=name: asked.append(name) or real())
    real_logs = otel_logs.get_logger_provider
    monkeypatch.setattr(otel_logs, "get_logger_provider", lambda: asked.append("logs") or real_logs())
    assert api.get("/healthz").status_code == 200
    assert asked == []


def test_the_board_learns_an_upload_committed_here_and_asks_nothing_after_it(service: Coordinator) -> None:
    fid, (a, b) = _federation(service, 2, eval_every=100)
    tasks, store = service.tasks, service.store
    for c in (a, b):  # version 0's evaluation first
        report(service, fid, 0, c, {"num_samples": 5, "accuracy": 0.5})
    assert tasks.next_task_at(fid, a, store.federation_stamp(fid, 60))["kind"] == "train"
    service.uploads.upload(fid, 1, a, _update(service, fid))
    with _statements(service) as seen:  # the board learnt the update at its commit
        got = tasks.next_task_at(fid, a, store.federation_stamp(fid, 60))
    assert got == tasks.next_task(fid, a) and got is None
    assert [q for q in seen if q.lstrip().upper().startswith("SELECT")] == []
    tasks.learn_upload(fid, 1, 2, b.id)  # another attempt's update is not this round's
    assert tasks.next_task_at(fid, b, store.federation_stamp(fid, 60))["kind"] == "train"


def test_a_held_version_is_served_without_a_query_and_counts_a_participants_download(
    service: Coordinator,
) -> None:
    fid, (a, b) = _federation(service, 2)
    tasks, store = service.tasks, service.store
    # the board of round 1 (based on version 0, which reading it brought into memory)
    assert tasks.next_task_at(fid, a, store.federation_stamp(fid, 60))["kind"] == "evaluate"
    with _statements(service) as seen:
        pv = tasks.cached_prompt(fid, "0", client=a)
        assert pv is not None and pv.version == 0
        assert tasks.cached_prompt(fid, "latest", client=a) is None  # a name needs the federation's row
        assert tasks.cached_prompt(fid, "7", client=a) is None  # not held: get_prompt answers (404)
    assert seen == []
    store.downloads.flush()
    with store.sessions() as s:
        counted = dict(s.execute(select(Participant.client_id, Participant.downloaded_bytes)).all())
    assert counted == {a.id: len(pv.blob), b.id: 0}  # a participant of the round based on version 0
    store.downloads.flush_at = 1  # a figure would make the log due: that write is not done here
    with _statements(service) as seen:
        assert tasks.cached_prompt(fid, "0", client=a) is None and seen == []
    store.downloads.record(999, 1, write=False)  # held past flush_at, never written by the holder
    assert store.downloads.pending() == 1
    with store.tx() as s:  # a change: the board is dropped, so a client's download needs the database
        store.lock_federation(s, fid).updated_at = store.clock() + 1
    assert tasks.cached_prompt(fid, "0", client=b) is None
    assert tasks.cached_prompt(fid, "0", client=None) is pv  # the admin's download counts nothing


def test_a_client_just_enrolled_is_authenticated_without_a_lookup_until_revoked(service: Coordinator) -> None:
    spec = FederationSpec.model_validate({**SMALL_SPEC, "min_clients": 2})
    fid = service.federations.create_federation(spec).id
    token, _ = service.enrolment.create_enrollment_token(fid)
    client, client_token = service.enrolment.enroll(fid, token, name="new", num_samples=5, info={})
    with _statements(service) as seen:
        assert service.enrolment.authenticate_client(fid, client_token).id == client.id
        with pytest.raises(Forbidden, match="belongs to federation"):
            service.enrolment.authenticate_client(fid + 1, client_token)
    assert seen == []  # the enrolment cached the token it gave out
    service.enrolment.revoke_client(fid, client.id)
    with pytest.raises(Forbidden, match="revoked"):
        service.enrolment.authenticate_client(fid, client_token)
