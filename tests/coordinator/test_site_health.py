"""Site health: a training worker's heartbeat, the states a site is shown in (live, training, stale,
gone, revoked), one 'client_stale' event per silence and the stale gauge; the rule on literal inputs
and through the HTTP API on every backend with the coordinator's clock moved by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.logic.sites import count_states, site_state
from fedprompt.shared.spec import FederationSpec

from tests.coordinator.conftest import FakeClock
from tests.coordinator.test_secagg_rounds import _served
from tests.helpers import ADMIN_AUTH, SMALL_SPEC, enrol_clients

API = "/api/v1/federations"


def _state(silent: float, **kw: object) -> str:
    args = {
        "now": 1000.0,
        "last_seen_at": 1000.0 - silent,
        "revoked": False,
        "activity": None,
        "open_round": 2,
        "stale_after_s": 180.0,
        "availability_timeout_s": 600.0,
    } | kw
    return site_state(**args)  # type: ignore[arg-type]


def test_a_site_state_from_its_silence_and_its_last_heartbeat() -> None:
    assert _state(10) == "live"
    assert _state(10, activity={"phase": "training", "round": 2}) == "training"
    assert _state(10, activity={"phase": "training", "round": 1}) == "live"  # an earlier round's
    assert _state(10, activity={"phase": "idle", "round": 2}) == "live"
    assert _state(10, activity={"phase": "training", "round": 2}, open_round=None) == "live"
    assert _state(181, activity={"phase": "training", "round": 2}) == "stale"  # training, but silent
    assert _state(601) == "gone"
    assert _state(10, revoked=True) == "revoked"
    assert count_states(["live", "stale", "stale"]) == {
        "live": 1,
        "training": 0,
        "stale": 2,
        "gone": 0,
        "revoked": 0,
    }
    spec = FederationSpec(availability_timeout_s=600)
    assert (spec.heartbeat_s, spec.stale_after_s) == (60.0, 180.0)
    assert FederationSpec(availability_timeout_s=30).stale_after_s == 9.0


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, FakeClock]]:
    with _served(db_url, tmp_path) as pair:
        yield pair


def _states(api: TestClient, fid: int) -> dict[str, str]:
    return {c["name"]: c["state"] for c in api.get(f"{API}/{fid}/clients", headers=ADMIN_AUTH).json()}


def _stale_events(api: TestClient, fid: int) -> list[str]:
    return [
        e["message"]
        for e in api.get(f"{API}/{fid}/events", headers=ADMIN_AUTH).json()
        if e["kind"] == "client_stale"
    ]


def test_a_silent_site_is_shown_stale_reported_once_and_then_gone(
    served: tuple[TestClient, FakeClock],
) -> None:
    api, clock = served
    spec = {**SMALL_SPEC, "availability_timeout_s": 600}  # heartbeat 60 s, stale after 180 s
    fid, (busy, quiet) = enrol_clients(api, spec, 2)  # round 1 opens with both
    beat = {"phase": "training", "round": 1, "step": 3, "total_steps": 100}
    assert api.put(f"{API}/{fid}/activity", json=beat, headers=busy).status_code == 204
    assert _states(api, fid) == {"site-0": "training", "site-1": "live"}

    clock.advance(150)  # the busy site beats on; the quiet one has been silent 150 s
    assert api.put(f"{API}/{fid}/activity", json={**beat, "step": 60}, headers=busy).status_code == 204
    assert _states(api, fid) == {"site-0": "training", "site-1": "live"}
    clock.advance(40)  # quiet: 190 s
    assert _states(api, fid) == {"site-0": "training", "site-1": "stale"}
    api.app.state.service.cycle.sweep()
    api.app.state.service.cycle.sweep()
    (message,) = _stale_events(api, fid)  # once per silence
    assert "'site-1' silent for 190 s (stale after 180 s)" in message
    assert f'fedprompt_stale_clients{{federation="{fid}"}} 1.0' in api.get("/metrics").text

    clock.advance(200)  # the busy site fell silent mid-training too (190 + 200 − 150 s ago)
    api.app.state.service.cycle.sweep()
    events = _stale_events(api, fid)
    assert len(events) == 2 and "last heartbeat: training round 1, step 60 of 100" in events[1]
    assert _states(api, fid) == {"site-0": "stale", "site-1": "stale"}
    clock.advance(400)  # silent 640 and 790 s: past the 600 s availability timeout
    assert _states(api, fid) == {"site-0": "gone", "site-1": "gone"}
    assert f'fedprompt_stale_clients{{federation="{fid}"}} 0.0' in api.get("/metrics").text

    # back: a heartbeat makes it live again, and a new silence is reported again
    assert (
        api.put(f"{API}/{fid}/activity", json={"phase": "idle", "round": 1}, headers=quiet).status_code == 204
    )
    assert _states(api, fid)["site-1"] == "live"
    clock.advance(190)
    api.app.state.service.cycle.sweep()
    assert len(_stale_events(api, fid)) == 3


def test_a_heartbeat_is_checked(served: tuple[TestClient, FakeClock]) -> None:
    api, _ = served
    fid, (me,) = enrol_clients(api, SMALL_SPEC, 1)
    bad = api.put(f"{API}/{fid}/activity", json={"phase": "sleeping"}, headers=me)
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("application/problem+json")
    cid = api.get(f"{API}/{fid}/clients", headers=ADMIN_AUTH).json()[0]["id"]
    assert api.delete(f"{API}/{fid}/clients/{cid}", headers=ADMIN_AUTH).status_code == 204
    assert api.put(f"{API}/{fid}/activity", json={"phase": "idle"}, headers=me).status_code == 403
    assert _states(api, fid) == {"site-0": "revoked"}


def test_the_scrape_parses_and_carries_the_federation_gauges(served: tuple[TestClient, FakeClock]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    api, _ = served
    fid, (a, b) = enrol_clients(api, SMALL_SPEC, 2)
    api.put(f"{API}/{fid}/activity", json={"phase": "training", "round": 1, "step": 1}, headers=a)
    for headers in (a, b):
        api.post(
            f"{API}/{fid}/rounds/0/evaluation", json={"num_samples": 10, "accuracy": 0.6}, headers=headers
        )
    for path in ("/openapi.json", "/dashboard/static/dashboard.css", "/docs"):
        assert api.get(path).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(api.get("/metrics").text)}

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in families[name].samples if s.labels == labels)

    assert value("fedprompt_sites", federation=str(fid), state="training") == 1
    assert value("fedprompt_sites", federation=str(fid), state="live") == 1
    assert value("fedprompt_current_round", federation=str(fid)) == 1
    assert value("fedprompt_latest_version", federation=str(fid)) == 0
    assert value("fedprompt_latest_accuracy", federation=str(fid)) == 0.6
    assert "process_resident_memory_bytes" in families and "python_info" in families
    assert not [n for f in families.values() for s in f.samples if (n := s.name).endswith("_created")]
    routes = {s.labels["route"] for s in families["fedprompt_http_request_duration_seconds"].samples}
    assert {"/openapi.json", "/dashboard/static/{path}", "/docs"} <= routes and "<unmatched>" not in routes
