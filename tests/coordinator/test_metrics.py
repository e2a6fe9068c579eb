"""/metrics: round, upload and rejection counters after a real 2-round federation over the API."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.metrics import (
    UPLOAD_ROUTE,
    CoordinatorMetrics,
    DatabaseGauges,
    RoundTransition,
    instrument_sessions,
    rejection_reason,
)
from fedprompt.coordinator.persistence.db import Round
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared.spec import FederationSpec
from prometheus_client.parser import text_string_to_metric_families

from tests.coordinator.conftest import LIMIT, FakeClock
from tests.helpers import ADMIN, SMALL_SPEC, enrol_clients, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(api: TestClient) -> Samples:
    """GET /metrics parsed into {(sample name, sorted labels): value}."""
    resp = api.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (KeyError when the series is absent)."""
    return samples[(name, tuple(sorted(labels.items())))]


def enrol(api: TestClient, spec: dict[str, Any], n: int) -> tuple[int, list[dict[str, str]]]:
    """Create a federation and enrol n clients; returns (fid, their auth headers)."""
    return enrol_clients(api, spec, n)


def put(api: TestClient, fid: int, number: int, body: bytes, headers: dict[str, str]) -> int:
    """Upload and return the status code."""
    return api.put(
        f"/api/v1/federations/{fid}/rounds/{number}/update", content=body, headers=headers
    ).status_code


def test_two_round_federation_counts_rounds_uploads_and_rejections(api: TestClient) -> None:
    # Prepare: 3 clients, C = 2/3 → 2 selected per round, 2 rounds
    spec = {**SMALL_SPEC, "rounds": 2, "fraction": 0.5, "expected_clients": 3}
    fid, clients = enrol(api, spec, 3)
    round1 = api.get(f"/api/v1/federations/{fid}/rounds/1", headers=ADMIN_H).json()
    selected = sorted(p["client_id"] for p in round1["participants"])
    by_id = dict(zip(range(1, 4), clients, strict=True))
    outsider = next(h for cid, h in by_id.items() if cid not in selected)
    first, second = by_id[selected[0]], by_id[selected[1]]

    # Execute: round 1 with every kind of refusal along the way
    accepted = update_blob(spec, 1, base_version=0)
    statuses = [
        put(api, fid, 1, accepted, first),  # 201
        put(api, fid, 1, accepted, first),  # identical re-send → 200
        put(api, fid, 1, update_blob(spec, 2, base_version=0), first),  # different → 409
        put(api, fid, 1, update_blob(spec, 3, base_version=0), outsider),  # not selected → 403
        put(api, fid, 1, b"not safetensors at all", second),  # → 422
        put(api, fid, 1, b"x" * (LIMIT + 1), second),  # → 413
        put(api, fid, 9, update_blob(spec, 4), second),  # round never opened → 404
        put(api, fid, 1, accepted, {"Authorization": "Bearer fpc_nobody"}),  # → 401
        put(api, fid, 1, update_blob(spec, 5, base_version=0), second),  # 201, closes round 1
        put(api, fid, 1, update_blob(spec, 6, base_version=0), outsider),  # round closed → 410
    ]
    round2 = api.get(f"/api/v1/federations/{fid}/rounds/2", headers=ADMIN_H).json()
    for p in sorted(p["client_id"] for p in round2["participants"]):
        statuses.append(put(api, fid, 2, update_blob(spec, 10 + p, base_version=1), by_id[p]))

    # Assert: the API answered as the protocol says, and /metrics counted exactly that
    assert statuses == [201, 200, 409, 403, 422, 413, 404, 401, 201, 410, 201, 201]
    assert api.get(f"/api/v1/federations/{fid}", headers=ADMIN_H).json()["state"] == "completed"
    m = scrape(api)
    assert value(m, "fedprompt_rounds_total", state="open") == 2
    assert value(m, "fedprompt_rounds_total", state="closed") == 2
    assert value(m, "fedprompt_rounds_total", state="failed") == 0
    assert value(m, "fedprompt_round_duration_seconds_count", outcome="closed") == 2
    assert value(m, "fedprompt_uploads_total", result="accepted") == 4
    assert value(m, "fedprompt_uploads_total", result="duplicate") == 1
    expected = {"conflict": 1, "forbidden": 1, "invalid": 1, "too_large": 1, "not_found": 1}
    expected |= {"unauthorized": 1, "gone": 1}
    for reason, n in expected.items():
        assert value(m, "fedprompt_upload_rejections_total", reason=reason) == n, reason
    assert value(m, "fedprompt_upload_bytes_total") == len(accepted) * 4  # all blobs have one size
    assert (
        value(
            m, "fedprompt_http_request_duration_seconds_count", method="PUT", route=UPLOAD_ROUTE, status="201"
        )
        == 4
    )
    assert value(m, "fedprompt_http_received_bytes_total", route=UPLOAD_ROUTE) > len(accepted) * 4
    assert value(m, "fedprompt_db_rounds", state="closed") == 2
    assert value(m, "fedprompt_db_rounds", state="open") == 0
    assert value(m, "fedprompt_db_federations", state="completed") == 1
    assert value(m, "fedprompt_active_clients", federation=str(fid)) == 3
    assert value(m, "fedprompt_database_up") == 1
    # refused uploads are also tallied per client for the dashboard's clients table
    refused = api.app.state.metrics.refused_uploads(fid)
    assert refused == {selected[0]: 1, selected[1]: 3, next(c for c in by_id if c not in selected): 2}


def test_failed_round_and_retry_are_counted(api: TestClient) -> None:
    # Prepare: a federation whose round 1 gets no upload before its deadline
    clock = FakeClock()
    api.app.state.service.clock = clock
    fid, _ = enrol(api, {**SMALL_SPEC, "round_deadline_s": 30}, 2)

    # Execute: the deadline passes; the sweep fails attempt 1 and opens attempt 2
    clock.advance(31)
    api.app.state.service.cycle.sweep()

    # Assert
    rounds = api.get(f"/api/v1/federations/{fid}/rounds", headers=ADMIN_H).json()
    assert [(r["attempt"], r["state"]) for r in rounds] == [(1, "failed"), (2, "open")]
    m = scrape(api)
    assert value(m, "fedprompt_rounds_total", state="failed") == 1
    assert value(m, "fedprompt_rounds_total", state="open") == 2
    assert value(m, "fedprompt_round_duration_seconds_count", outcome="failed") == 1
    assert value(m, "fedprompt_round_duration_seconds_sum", outcome="failed") == pytest.approx(31)
    assert value(m, "fedprompt_db_rounds", state="failed") == 1


def test_two_apps_in_one_process_have_separate_registries(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    upgrade(db_url)
    settings = Settings(database_url=db_url, admin_token=ADMIN, data_dir=tmp_path)
    with (
        TestClient(create_app(settings, sweep=False)) as a,
        TestClient(create_app(settings, sweep=False)) as b,
    ):
        enrol(a, SMALL_SPEC, 2)  # round 1 opens in app a's process-local counters
        ma, mb = scrape(a), scrape(b)
    assert value(ma, "fedprompt_rounds_total", state="open") == 1
    assert value(mb, "fedprompt_rounds_total", state="open") == 0  # counters: per process
    assert value(mb, "fedprompt_db_rounds", state="open") == 1  # gauges: from the shared database


def test_rolled_back_transitions_are_not_counted(service, clock) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    seen: list[RoundTransition] = []
    instrument_sessions(service.sessions, seen.append)
    fed = service.federations.create_federation(FederationSpec.model_validate(SMALL_SPEC))

    def add_round(number: int) -> None:
        with service.sessions() as s, s.begin():
            s.add(
                Round(
                    federation_id=fed.id,
                    number=number,
                    attempt=1,
                    state="open",
                    base_version=0,
                    opened_at=clock(),
                    deadline_at=clock() + 60,
                    stats={},
                )
            )
            s.flush()
            if number == 1:
                raise RuntimeError("rolled back after the flush")

    # Execute
    with pytest.raises(RuntimeError):
        add_round(1)
    add_round(2)

    # Assert: only the committed one
    assert [(t.round, t.state) for t in seen] == [(2, "open")]


def test_database_gauges_report_a_failing_database_instead_of_failing_the_scrape() -> None:
    def broken() -> dict[str, Any]:
        raise ConnectionError("database is down")

    metrics = CoordinatorMetrics(broken)
    text = metrics.render()[0].decode()
    assert "fedprompt_database_up 0.0" in text
    assert "fedprompt_rounds_total" in text  # process counters still there
    assert [m.name for m in DatabaseGauges(broken).describe()][0] == "fedprompt_database_up"


@pytest.mark.parametrize(
    ("status", "reason"),
    [(401, "unauthorized"), (403, "forbidden"), (404, "not_found"), (409, "conflict"), (410, "gone")]
    + [(413, "too_large"), (422, "invalid"), (500, "server_error"), (418, "http_418")],
)
def test_rejection_reason_names_the_service_error(status: int, reason: str) -> None:
    assert rejection_reason(status) == reason


def test_worker_metrics_endpoint_exposes_training_metrics() -> None:
    from fedprompt.worker.app import WorkerMetrics
    from prometheus_client import generate_latest

    metrics = WorkerMetrics()
    metrics.steps.inc(3)
    metrics.step_seconds.observe(0.2)
    metrics.eval_accuracy.set(0.75)
    text = generate_latest(metrics.registry).decode()
    assert "fedprompt_worker_training_steps_total 3.0" in text
    assert "fedprompt_worker_step_seconds_count 1.0" in text
    assert "fedprompt_worker_last_accuracy 0.75" in text
