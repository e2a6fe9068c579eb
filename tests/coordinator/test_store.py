"""The coordinator's store and round logic, run on every backend (SQLite file and real Postgres)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
from fedprompt.coordinator.errors import Conflict, Forbidden, Gone, NotFound, Unauthorized
from fedprompt.coordinator.service import Coordinator
from fedprompt.coordinator.usecases.enrolment import PendingEnrolment
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec

from tests.helpers import SMALL_SPEC, report, update_blob


def _federation(service: Coordinator, **overrides) -> tuple[int, FederationSpec]:  # type: ignore[no-untyped-def]
    spec = FederationSpec.model_validate({**SMALL_SPEC, **overrides})
    return service.federations.create_federation(spec).id, spec


def _enrol(service: Coordinator, fid: int, n: int, samples: int = 10) -> list:  # type: ignore[type-arg]
    token, _ = service.enrolment.create_enrollment_token(fid)
    return [
        service.enrolment.enroll(fid, token, name=f"c{i}", num_samples=samples, info={})[0] for i in range(n)
    ]


def test_federation_waits_for_min_clients_then_opens_round_one(service: Coordinator) -> None:
    fid, _ = _federation(service, min_clients=3)
    _enrol(service, fid, 2)
    assert service.reads.federation_status(fid)["state"] == "waiting"
    _enrol(service, fid, 1)
    status = service.reads.federation_status(fid)
    assert status["state"] == "running"
    assert status["open_round"]["round"] == 1
    assert len(status["open_round"]["participants"]) == 3


def test_selection_takes_fraction_and_is_reproducible(service: Coordinator, db_url: str) -> None:
    fid, _ = _federation(service, min_clients=2, fraction=0.5, expected_clients=6)
    _enrol(service, fid, 6)
    first = service.reads.round_detail(fid, 1)
    assert len(first["participants"]) == 3  # max(ceil(0.5 * 6), 2)
    # A second federation with the same seed and client set selects the same positions.
    fid2, _ = _federation(service, min_clients=2, fraction=0.5, expected_clients=6)
    _enrol(service, fid2, 6)
    second = service.reads.round_detail(fid2, 1)
    offset = min(c["id"] for c in service.reads.list_clients(fid2)) - min(
        c["id"] for c in service.reads.list_clients(fid)
    )
    assert [p["client_id"] - offset for p in second["participants"]] == [
        p["client_id"] for p in first["participants"]
    ]


def test_upload_aggregates_weighted_mean_and_advances(service: Coordinator) -> None:
    fid, spec = _federation(service)
    (a,), (b,) = _enrol(service, fid, 1, samples=10), _enrol(service, fid, 1, samples=30)
    blob_a = update_blob(spec, 1, num_samples=10, base_version=0, metrics={"loss": 1.0})
    blob_b = update_blob(spec, 2, num_samples=30, base_version=0, metrics={"loss": 3.0})
    assert service.uploads.upload(fid, 1, a, blob_a).created
    assert service.uploads.upload(fid, 1, b, blob_b).created
    service.cycle.after_upload(fid)
    pv = service.tasks.get_prompt(fid, 1)
    got = wire.decode(pv.blob)[0]["prompt_embeddings"]
    ta, tb = (wire.decode(x)[0]["prompt_embeddings"] for x in (blob_a, blob_b))
    expected = (ta.astype(np.float64) * 0.25 + tb.astype(np.float64) * 0.75).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    r1 = service.reads.round_detail(fid, 1)
    assert r1["state"] == "closed"
    assert r1["stats"]["train_loss"] == pytest.approx(2.5)
    assert r1["stats"]["bytes_up"] == len(blob_a) + len(blob_b)
    assert service.reads.federation_status(fid)["open_round"]["round"] == 2


def test_an_update_weighs_at_most_the_samples_its_client_enrolled_with(service: Coordinator) -> None:
    fid, spec = _federation(service)
    a, b = _enrol(service, fid, 2, samples=10)
    blob_a = update_blob(spec, 1, num_samples=10, base_version=0, metrics={"loss": 1.0})
    inflated = update_blob(spec, 2, num_samples=1000, base_version=0, metrics={"loss": 3.0})
    assert service.uploads.upload(fid, 1, a, blob_a).num_samples == 10
    receipt = service.uploads.upload(fid, 1, b, inflated)
    assert receipt.created and receipt.num_samples == 10  # clipped to the enrolled figure
    assert service.uploads.upload(fid, 1, b, inflated).receipt() == receipt.receipt()  # a re-send: the same
    service.cycle.after_upload(fid)
    got = wire.decode(service.tasks.get_prompt(fid, 1).blob)[0]["prompt_embeddings"]
    ta, tb = (wire.decode(x)[0]["prompt_embeddings"] for x in (blob_a, inflated))
    expected = (ta.astype(np.float64) * 0.5 + tb.astype(np.float64) * 0.5).astype(np.float32)
    np.testing.assert_array_equal(got, expected)  # an equal share, not 1000 / 1010 of the average
    stats = service.reads.round_detail(fid, 1)["stats"]
    assert stats["num_samples"] == 20 and stats["train_loss"] == pytest.approx(2.0)
    assert stats["notes"] == {
        str(b.id): "num_samples 1000 clipped to 10, the figure the client enrolled with"
    }


def test_identical_reupload_is_ok_and_different_one_conflicts(service: Coordinator) -> None:
    fid, spec = _federation(service, min_clients=2)
    a, _ = _enrol(service, fid, 2)
    blob = update_blob(spec, 1)
    first = service.uploads.upload(fid, 1, a, blob)
    again = service.uploads.upload(fid, 1, a, blob)
    assert first.created and not again.created and first.sha256 == again.sha256
    with pytest.raises(Conflict):
        service.uploads.upload(fid, 1, a, update_blob(spec, 2))


def test_closed_round_is_gone_but_identical_retry_still_acknowledged(service: Coordinator) -> None:
    fid, spec = _federation(service)
    a, b = _enrol(service, fid, 2)
    blob_a = update_blob(spec, 1)
    service.uploads.upload(fid, 1, a, blob_a)
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.after_upload(fid)
    assert not service.uploads.upload(fid, 1, a, blob_a).created  # the worker re-sends after a lost response
    with pytest.raises(Gone):
        service.uploads.upload(fid, 1, a, update_blob(spec, 3))
    with pytest.raises(NotFound):
        service.uploads.upload(fid, 7, a, update_blob(spec, 3))


def test_not_selected_client_is_forbidden(service: Coordinator) -> None:
    fid, spec = _federation(service, min_clients=2, fraction=0.5, expected_clients=4)
    clients = _enrol(service, fid, 4)
    selected = {p["client_id"] for p in service.reads.round_detail(fid, 1)["participants"]}
    outsider = next(c for c in clients if c.id not in selected)
    with pytest.raises(Forbidden):
        service.uploads.upload(fid, 1, outsider, update_blob(spec, 1))


def test_deadline_with_quorum_aggregates_partial_round(service: Coordinator, clock) -> None:  # type: ignore[no-untyped-def]
    fid, spec = _federation(service, min_clients=3, quorum=2, round_deadline_s=60)
    a, b, _c = _enrol(service, fid, 3)
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.sweep()
    assert service.reads.round_detail(fid, 1)["state"] == "open"
    clock.advance(61)
    service.cycle.sweep()
    r1 = service.reads.round_detail(fid, 1)
    assert r1["state"] == "closed" and r1["closed_by"] == "deadline" and r1["stats"]["updates"] == 2


def test_deadline_below_quorum_fails_and_retries_with_fresh_selection(service: Coordinator, clock) -> None:  # type: ignore[no-untyped-def]
    fid, spec = _federation(
        service, min_clients=2, quorum=2, fraction=0.5, round_deadline_s=60, expected_clients=6
    )
    clients = _enrol(service, fid, 6)
    first = service.reads.round_detail(fid, 1)
    chosen = next(c for c in clients if c.id == first["participants"][0]["client_id"])
    service.uploads.upload(fid, 1, chosen, update_blob(spec, 1))
    clock.advance(61)
    service.cycle.sweep()
    history = service.reads.rounds(fid)
    assert [(r["round"], r["attempt"], r["state"]) for r in history] == [(1, 1, "failed"), (1, 2, "open")]
    assert "below the quorum" in history[0]["failure_reason"]
    assert history[1]["base_version"] == 0


def test_operator_close_needs_quorum_then_aggregates(service: Coordinator) -> None:
    fid, spec = _federation(service, min_clients=2, quorum=1, auto_advance=False)
    a, _b = _enrol(service, fid, 2)
    assert service.reads.federation_status(fid)["open_round"] is None  # no auto-advance
    service.cycle.open_round(fid)
    with pytest.raises(Conflict, match="below the quorum"):
        service.cycle.close_round(fid, 1)
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    closed = service.cycle.close_round(fid, 1)
    assert closed["state"] == "closed" and closed["result_version"] == 1
    assert service.reads.federation_status(fid)["open_round"] is None
    with pytest.raises(Conflict):
        service.cycle.close_round(fid, 1)


def test_completes_after_t_rounds(service: Coordinator) -> None:
    fid, spec = _federation(service, rounds=2)
    a, b = _enrol(service, fid, 2)
    for r in (1, 2):
        service.uploads.upload(fid, r, a, update_blob(spec, r))
        service.uploads.upload(fid, r, b, update_blob(spec, 10 + r))
        service.cycle.after_upload(fid)
    status = service.reads.federation_status(fid)
    assert status["state"] == "completed" and status["latest_version"] == 2
    assert [r["state"] for r in service.reads.rounds(fid)] == ["closed", "closed"]


def test_pause_stops_auto_advance_and_resume_restarts(service: Coordinator) -> None:
    fid, spec = _federation(service)
    a, b = _enrol(service, fid, 2)
    service.federations.set_paused(fid, True)
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.after_upload(fid)
    assert service.reads.federation_status(fid)["open_round"] is None
    assert service.reads.federation_status(fid)["state"] == "paused"
    service.federations.set_paused(fid, False)
    assert service.reads.federation_status(fid)["open_round"]["round"] == 2


def test_revoked_client_cannot_authenticate_and_is_not_selected(service: Coordinator) -> None:
    fid, _ = _federation(service, min_clients=2, auto_advance=False)
    token, _ = service.enrolment.create_enrollment_token(fid)
    client, client_token = service.enrolment.enroll(fid, token, name="x", num_samples=5, info={})
    assert service.enrolment.authenticate_client(fid, client_token).id == client.id
    service.enrolment.revoke_client(fid, client.id)
    with pytest.raises(Forbidden, match="revoked"):
        service.enrolment.authenticate_client(fid, client_token)
    with pytest.raises(Unauthorized):
        service.enrolment.authenticate_client(fid, "fpc_not-a-token")


def test_enrolment_token_expiry_and_uses(service: Coordinator, clock) -> None:  # type: ignore[no-untyped-def]
    fid, _ = _federation(service, auto_advance=False)
    once, _ = service.enrolment.create_enrollment_token(fid, max_uses=1)
    service.enrolment.enroll(fid, once, name="a", num_samples=1, info={})
    with pytest.raises(Unauthorized, match="used up"):
        service.enrolment.enroll(fid, once, name="b", num_samples=1, info={})
    short, _ = service.enrolment.create_enrollment_token(fid, expires_in_s=10)
    clock.advance(11)
    with pytest.raises(Unauthorized, match="expired"):
        service.enrolment.enroll(fid, short, name="c", num_samples=1, info={})


def test_a_batch_of_enrolments_is_one_transaction_each_enrolment_answered_on_its_own(
    service: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    fid, _ = _federation(service, min_clients=3)
    token, _ = service.enrolment.create_enrollment_token(fid, max_uses=3)
    transactions = []
    tx = service.store.tx
    monkeypatch.setattr(service.store, "tx", lambda *a, **k: transactions.append(1) or tx(*a, **k))

    def item(token: str, name: str) -> PendingEnrolment:
        return PendingEnrolment(token, f"fpc_{name}", name, 5, {}, None, None)

    names = ["a", "stranger", "b", "c", "d"]
    outcomes = service.enrolment._enroll_batch(
        fid, [item("fpe_unknown" if n == "stranger" else token, n) for n in names]
    )
    assert len(transactions) == 1
    assert [type(o).__name__ for o in outcomes] == [
        "Client",
        "Unauthorized",
        "Client",
        "Client",
        "Unauthorized",
    ]
    assert "unknown enrolment token" in str(outcomes[1]) and "used up (3 uses)" in str(outcomes[4])
    assert [o.name for o in outcomes if not isinstance(o, BaseException)] == ["a", "b", "c"]
    status = service.reads.federation_status(fid)  # the third enrolment of the batch opened round 1
    assert status["state"] == "running" and len(status["open_round"]["participants"]) == 3


def test_an_enrolment_to_no_federation_is_refused_and_leaves_no_batcher_behind(service: Coordinator) -> None:
    for fid in range(1000, 1050):  # what a stranger probing ids would send
        with pytest.raises(NotFound):
            service.enrolment.enroll(fid, "fpe_guess", name="x", num_samples=1, info={})
    assert service.enrolment._enrolments._batchers == {}


def test_concurrent_enrolments_never_pass_a_tokens_use_limit(service: Coordinator) -> None:
    fid, _ = _federation(service, min_clients=100)
    token, _ = service.enrolment.create_enrollment_token(fid, max_uses=12)

    def enrol(i: int) -> object:
        try:
            return service.enrolment.enroll(fid, token, name=f"c{i}", num_samples=1, info={})
        except Unauthorized as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(enrol, range(20)))
    enrolled = [o for o in outcomes if isinstance(o, tuple)]
    assert len(enrolled) == 12 and len({client.id for client, _ in enrolled}) == 12
    assert all("used up" in str(o) for o in outcomes if not isinstance(o, tuple))
    for client, client_token in enrolled:
        assert service.enrolment.authenticate_client(fid, client_token).id == client.id


def test_tasks_evaluate_then_train_then_done(service: Coordinator) -> None:
    fid, spec = _federation(service, rounds=1)
    a, b = _enrol(service, fid, 2)
    task = service.tasks.next_task(fid, a)
    assert task["kind"] == "evaluate" and task["version"] == 0
    report(service, fid, 0, a, {"num_samples": 10, "accuracy": 0.5, "loss": 0.7})
    task = service.tasks.next_task(fid, a)
    assert (
        task["kind"] == "train" and task["round"] == 1 and task["config"]["local_steps"] == spec.local_steps
    )
    assert task["config"]["local_optimizer"] == spec.local_optimizer == "adamw"
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    assert service.tasks.next_task(fid, a) is None  # waiting for b
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.after_upload(fid)
    assert service.tasks.next_task(fid, a)["kind"] == "evaluate"
    report(service, fid, 1, a, {"num_samples": 30, "accuracy": 0.9, "loss": 0.2})
    report(service, fid, 1, b, {"num_samples": 10, "accuracy": 0.5, "loss": 0.6})
    assert service.tasks.next_task(fid, a)["kind"] == "done"
    evaluation = service.reads.round_detail(fid, 1)["evaluation"]
    assert evaluation["accuracy"] == pytest.approx(0.8) and evaluation["loss"] == pytest.approx(0.3)


def test_eval_every_asks_for_evaluations_of_version_0_every_nth_and_the_final_version(
    service: Coordinator,
) -> None:
    fid, spec = _federation(service, rounds=5, eval_every=2)
    a, b = _enrol(service, fid, 2)
    asked: list[int] = []
    for number in range(1, 6):
        task = service.tasks.next_task(fid, a)
        if task["kind"] == "evaluate":  # of the version the previous round made
            asked.append(task["version"])
            report(service, fid, task["version"], a, {"num_samples": 5, "accuracy": 0.5})
            task = service.tasks.next_task(fid, a)
        assert task["kind"] == "train" and task["round"] == number, task
        for c in (a, b):
            service.uploads.upload(
                fid, number, c, update_blob(spec, 10 * number + c.id, base_version=number - 1)
            )
        service.cycle.after_upload(fid)
    final = service.tasks.next_task(fid, a)
    assert final["kind"] == "evaluate" and final["version"] == 5  # the last round's, though 5 % 2 == 1
    asked.append(final["version"])
    report(service, fid, 5, a, {"num_samples": 5, "accuracy": 0.5})
    assert service.tasks.next_task(fid, a)["kind"] == "done"
    assert asked == [0, 2, 4, 5]


def test_only_the_first_evaluators_to_enrol_and_never_a_client_without_test_data_are_asked_to_evaluate(
    service: Coordinator,
) -> None:
    fid, _ = _federation(service, evaluators=2, auto_advance=False)
    token, _ = service.enrolment.create_enrollment_token(fid)
    none = service.enrolment.enroll(fid, token, name="no-test-data", num_samples=5, info={"num_eval": 0})[0]
    a, b, c = _enrol(service, fid, 3)

    def asked(client) -> bool:  # type: ignore[no-untyped-def]
        task = service.tasks.next_task(fid, client)
        return task is not None and task["kind"] == "evaluate"

    # `none` enrolled first and counts toward the two, but holds nothing to evaluate
    assert [asked(x) for x in (none, a, b, c)] == [False, True, False, False]
    service.enrolment.revoke_client(fid, none.id)  # revoked clients are not counted: b moves up
    assert [asked(x) for x in (a, b, c)] == [True, True, False]


def test_download_of_base_prompt_is_counted_for_participants(service: Coordinator) -> None:
    fid, spec = _federation(service)
    a, b = _enrol(service, fid, 2)
    pv = service.tasks.get_prompt(fid, 0, client=a)
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.after_upload(fid)
    assert service.reads.round_detail(fid, 1)["stats"]["bytes_down"] == len(pv.blob)


def test_stale_base_version_is_refused(service: Coordinator) -> None:
    fid, spec = _federation(service)
    a, _ = _enrol(service, fid, 2)
    with pytest.raises(Conflict, match="version 3"):
        service.uploads.upload(fid, 1, a, update_blob(spec, 1, base_version=3))


def test_robust_rule_notes_appear_in_the_round_history(service: Coordinator) -> None:
    fid, spec = _federation(service, aggregation={"name": "norm_bound", "params": {"bound": 0.5}})
    a, b = _enrol(service, fid, 2)
    service.uploads.upload(fid, 1, a, update_blob(spec, 1))
    service.uploads.upload(fid, 1, b, update_blob(spec, 2))
    service.cycle.after_upload(fid)
    notes = service.reads.round_detail(fid, 1)["stats"]["notes"]
    assert set(notes) == {str(a.id), str(b.id)} and all("clipped" in n for n in notes.values())


def test_invalid_aggregation_params_are_refused_at_creation(service: Coordinator) -> None:
    from fedprompt.coordinator.errors import Invalid

    with pytest.raises(Invalid, match="beta"):
        _federation(service, aggregation={"name": "trimmed_mean", "params": {"beta": 0.9}})


def _race(*calls) -> list:  # type: ignore[no-untyped-def]
    """Run the calls at the same moment on threads; their results or the exceptions they raised."""
    barrier = threading.Barrier(len(calls))

    def run(call):  # type: ignore[no-untyped-def]
        barrier.wait()
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - the caller inspects what each call raised
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_uploads_of_one_client_get_one_acknowledgement_or_a_conflict(service: Coordinator) -> None:
    for trial in range(5):
        fid, spec = _federation(service, min_clients=2)
        a, _ = _enrol(service, fid, 2)
        blob = update_blob(spec, trial)
        same = _race(
            partial(service.uploads.upload, fid, 1, a, blob), partial(service.uploads.upload, fid, 1, a, blob)
        )
        assert sorted(r.created for r in same) == [False, True], same  # the loser gets the same answer
        assert {r.sha256 for r in same} == {wire.sha256(blob)}
        fid, spec = _federation(service, min_clients=2)
        a, _ = _enrol(service, fid, 2)
        other = _race(*(partial(service.uploads.upload, fid, 1, a, update_blob(spec, i)) for i in (1, 2)))
        assert sorted(type(r).__name__ for r in other) == ["Conflict", "UploadResult"], other


def test_every_acknowledged_upload_racing_a_close_is_aggregated(service: Coordinator) -> None:
    for trial in range(5):
        fid, spec = _federation(service, min_clients=2, expected_clients=8, quorum=1)
        first, *rest = _enrol(service, fid, 8)
        service.uploads.upload(fid, 1, first, update_blob(spec, 100 + trial, base_version=0))
        uploads = [
            partial(service.uploads.upload, fid, 1, c, update_blob(spec, i, base_version=0))
            for i, c in enumerate(rest)
        ]
        results = _race(*uploads, partial(service.cycle.close_round, fid, 1))
        acknowledged = [r for r in results[:-1] if not isinstance(r, Exception)]
        assert all(isinstance(r, Gone) for r in results[:-1] if isinstance(r, Exception)), results
        assert all(r.created for r in acknowledged)
        stats = service.reads.round_detail(fid, 1)["stats"]
        assert stats["updates"] == 1 + len(acknowledged), (stats["updates"], results)


def test_uploads_arriving_together_are_committed_together_each_with_its_own_answer(
    service: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    fid, spec = _federation(service, min_clients=6, expected_clients=6)
    clients = _enrol(service, fid, 6)
    batches: list[int] = []
    write = service.uploads._store_update_batch

    def slow_write(fid_: int, items):  # type: ignore[no-untyped-def]
        batches.append(len(items))
        time.sleep(0.05)  # a slow disk: the other uploads queue behind this transaction
        return write(fid_, items)

    monkeypatch.setattr(service.uploads, "_store_update_batch", slow_write)
    blobs = [update_blob(spec, i) for i in range(6)]
    calls = [partial(service.uploads.upload, fid, 1, c, b) for c, b in zip(clients, blobs, strict=True)]
    calls.append(partial(service.uploads.upload, fid, 1, clients[0], blobs[0]))  # a re-send: same answer
    calls.append(
        partial(service.uploads.upload, fid, 1, clients[1], update_blob(spec, 99))
    )  # a different one
    results = _race(*calls)
    answers = sorted(type(r).__name__ for r in results)
    assert answers == ["Conflict"] + ["UploadResult"] * 7, results
    created = [r for r in results if not isinstance(r, Exception) and r.created]
    assert sorted(r.client_id for r in created) == sorted(c.id for c in clients)  # each stored once
    assert max(batches) > 1  # some uploads shared a transaction
    assert any(r.round_complete for r in created)  # the batch that stored the last one says so
    service.cycle.after_upload(fid)
    assert service.reads.round_detail(fid, 1)["stats"]["updates"] == 6  # all six aggregated


def test_prompt_versions_held_in_memory_stay_few_and_old_ones_are_read_again(service: Coordinator) -> None:
    from fedprompt.coordinator.persistence.db import PromptVersion
    from fedprompt.coordinator.persistence.store import VERSION_CACHE_ENTRIES

    fid, spec = _federation(service, min_clients=1)
    _enrol(service, fid, 1)  # round 1 opens: version 0 is final from now on
    blobs = {v: update_blob(spec, v) for v in range(1, 2 * VERSION_CACHE_ENTRIES)}
    with service.sessions.begin() as s:
        s.add_all(
            PromptVersion(federation_id=fid, version=v, blob=b, sha256=wire.sha256(b), created_at=0.0)
            for v, b in blobs.items()
        )
    for _ in range(2):
        for v, b in blobs.items():
            assert service.tasks.get_prompt(fid, v).blob == b
        assert len(service.store._versions) <= VERSION_CACHE_ENTRIES
