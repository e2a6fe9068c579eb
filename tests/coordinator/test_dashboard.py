"""The dashboard: login and session cookie, CSRF guard, rendering, live fragment, view model."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.api.session import SESSION_COOKIE, new_session, session_is_valid
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.dashboard import STATIC_DIR, TEMPLATES_DIR, fmt_bytes, fmt_duration, fmt_pct
from fedprompt.coordinator.dashboard.view import (
    communication,
    federation_detail,
    pick_federation,
    secure_summary,
    series,
    timeline,
)
from fedprompt.coordinator.logic.ledger import ledger
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared.spec import FederationSpec

from tests.helpers import ADMIN, SMALL_SPEC, update_blob

ROOT = Path(__file__).resolve().parents[2]
ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
CSRF = {"X-Requested-With": "fedprompt-dashboard"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    upgrade(url)
    settings = Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path)
    with TestClient(create_app(settings, sweep=False), follow_redirects=False) as client:
        yield client


def login(api: TestClient) -> None:
    """Log in through the form; the client keeps the cookie."""
    resp = api.post("/dashboard/login", data={"token": ADMIN})
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard"


@pytest.fixture
def running(api: TestClient) -> dict[str, Any]:
    """A federation with 2 clients, round 1 closed with evaluations (asr included), round 2 open."""
    fid = api.post(
        "/api/v1/federations", json={**SMALL_SPEC, "name": "demo <b>fed</b>"}, headers=ADMIN_H
    ).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_H).json()["token"]
    clients = []
    for i in range(2):
        r = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"hospital-{i}", "num_samples": 100},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        clients.append({"id": r["client_id"], "h": {"Authorization": f"Bearer {r['token']}"}})
    for i, c in enumerate(clients):
        body = update_blob(SMALL_SPEC, i, base_version=0, metrics={"loss": 0.5})
        resp = api.put(f"/api/v1/federations/{fid}/rounds/1/update", content=body, headers=c["h"])
        assert resp.status_code == 201
    for i, c in enumerate(clients):  # round 1 closed: both evaluate prompt version 1
        report = {"num_samples": 50, "accuracy": 0.6 + 0.1 * i, "loss": 0.7, "metrics": {"asr": 0.2}}
        resp = api.post(f"/api/v1/federations/{fid}/rounds/1/evaluation", json=report, headers=c["h"])
        assert resp.status_code == 201
    return {"fid": fid, "clients": clients}


def test_dashboard_redirects_to_login_without_a_session(api: TestClient) -> None:
    resp = api.get("/dashboard")
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard/login"
    form = api.get("/dashboard/login")
    assert form.status_code == 200 and 'name="token"' in form.text and 'type="password"' in form.text


def test_wrong_token_is_refused_without_a_cookie(api: TestClient) -> None:
    resp = api.post("/dashboard/login", data={"token": "not-the-admin-token-at-all"})
    assert resp.status_code == 401
    assert "set-cookie" not in resp.headers
    assert "not the admin token" in resp.text
    assert "not-the-admin-token-at-all" not in resp.text  # never echoed back


def test_login_sets_an_httponly_strict_cookie_that_is_not_the_token(api: TestClient) -> None:
    # Execute
    resp = api.post("/dashboard/login", data={"token": ADMIN})

    # Assert
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard"
    cookie = resp.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=v1.")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age="):
        assert attribute.lower() in cookie.lower(), attribute
    assert ADMIN not in cookie
    page = api.get("/dashboard")
    assert page.status_code == 200
    assert ADMIN not in page.text and ADMIN not in str(page.url)


def test_page_headers_forbid_framing_foreign_scripts_and_caching(api: TestClient) -> None:
    login(api)
    headers = api.get("/dashboard").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["cache-control"] == "no-store"


def test_session_cookie_authorizes_the_rest_api_and_state_changes_need_the_csrf_header(
    api: TestClient, running: dict[str, Any]
) -> None:
    fid = running["fid"]
    login(api)
    # reads work with the cookie alone
    assert api.get(f"/api/v1/federations/{fid}").status_code == 200
    # a state change with the cookie but without the header is refused and changes nothing
    refused = api.post(f"/api/v1/federations/{fid}/pause")
    assert refused.status_code == 403 and "X-Requested-With" in refused.json()["detail"]
    assert api.get(f"/api/v1/federations/{fid}").json()["paused"] is False
    # with the header, the same endpoint curl uses does it
    assert api.post(f"/api/v1/federations/{fid}/pause", headers=CSRF).json()["paused"] is True


def test_bad_or_expired_cookie_gets_401_and_bearer_still_works(api: TestClient) -> None:
    api.cookies.set(SESSION_COOKIE, new_session("another-admin-token-0123456789"))
    resp = api.get("/api/v1/federations")
    assert resp.status_code == 401 and "log in again" in resp.json()["detail"]
    assert api.get("/dashboard/live").status_code == 401
    assert api.get("/dashboard").status_code == 303
    api.cookies.clear()
    assert api.get("/api/v1/federations", headers=ADMIN_H).status_code == 200
    missing = api.get("/api/v1/federations")  # neither: the original message
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["detail"]


def test_session_values_expire_and_are_bound_to_the_admin_token() -> None:
    value = new_session(ADMIN, now=1000.0, ttl=60)
    assert session_is_valid(value, ADMIN, now=1059.0)
    assert not session_is_valid(value, ADMIN, now=1061.0)
    assert not session_is_valid(value, ADMIN + "x", now=1001.0)
    tampered = re.sub(r"v1\.(\d+)\.", lambda m: f"v1.{int(m.group(1)) + 9999}.", value)
    assert not session_is_valid(tampered, ADMIN, now=1001.0)
    assert not session_is_valid("garbage", ADMIN) and not session_is_valid(None, ADMIN)


def test_logout_clears_the_cookie(api: TestClient) -> None:
    login(api)
    resp = api.post("/dashboard/logout")
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard/login"
    assert SESSION_COOKIE in resp.headers["set-cookie"] and "max-age=0" in resp.headers["set-cookie"].lower()
    assert api.get("/dashboard").status_code == 303


def test_page_shows_the_federation_round_clients_and_actions(
    api: TestClient, running: dict[str, Any]
) -> None:
    # Prepare: one client of round 2 has uploaded
    fid, (a, _) = running["fid"], running["clients"]
    body = update_blob(SMALL_SPEC, 7, base_version=1)
    api.put(f"/api/v1/federations/{fid}/rounds/2/update", content=body, headers=a["h"])
    login(api)

    # Execute
    html = api.get("/dashboard").text

    # Assert
    assert "demo &lt;b&gt;fed&lt;/b&gt;" in html and "<b>fed</b>" not in html  # autoescaped
    assert re.search(r"data-current-round>\s*2 / 3\s*<", html)
    assert re.search(r"data-uploaded>\s*1 / 2\s*<", html)
    assert f'data-url="/api/v1/federations/{fid}/rounds/2/close"' in html
    assert f'data-url="/api/v1/federations/{fid}/pause"' in html
    assert (
        f'data-url="/api/v1/federations/{fid}/clients/{a["id"]}"' in html and 'data-method="DELETE"' in html
    )
    assert 'data-round="1" data-attempt="1" data-state="closed"' in html
    assert "data-deadline=" in html
    assert "/dashboard/static/vendor/uplot/uPlot.iife.min.js" in html
    assert "cdn" not in html.lower() and "https://" not in html  # everything from this server
    assert "hospital-0" in html and "hospital-1" in html


def test_live_fragment_has_every_region_and_the_chart_series(
    api: TestClient, running: dict[str, Any]
) -> None:
    login(api)
    resp = api.get(f"/dashboard/live?federation={running['fid']}")
    assert resp.status_code == 200
    ids = re.findall(r'id="([\w-]+)" data-live', resp.text)
    assert ids == [
        "server-clock",
        "fed-list",
        "fed-head",
        "fed-comm",
        "fed-timeline",
        "fed-sites",
        "fed-clients",
        "chart-data",
    ]
    data = re.search(
        r'<script type="application/json" id="chart-data" data-live>(.*?)</script>', resp.text, re.S
    )
    assert data is not None
    chart = json.loads(data.group(1))
    assert chart["federation"] == running["fid"] and chart["has_asr"] is True
    assert chart["series"]["version"] == [1]
    assert chart["series"]["accuracy"] == [pytest.approx(0.65)]
    assert chart["series"]["asr"] == [pytest.approx(0.2)]


def test_live_fragment_needs_the_admin(api: TestClient) -> None:
    resp = api.get("/dashboard/live")
    assert resp.status_code == 401
    assert resp.headers["content-type"].startswith("application/problem+json")


def test_empty_coordinator_page_says_how_to_start(api: TestClient) -> None:
    login(api)
    html = api.get("/dashboard").text
    assert "No federation yet" in html and "fedprompt federation create" in html


def test_vendored_chart_library_is_served_with_its_license(api: TestClient) -> None:
    js = api.get("/dashboard/static/vendor/uplot/uPlot.iife.min.js")
    assert js.status_code == 200 and "uPlot" in js.text[:2000]
    assert api.get("/dashboard/static/dashboard.js").status_code == 200
    assert "MIT License" in (STATIC_DIR / "vendor" / "uplot" / "LICENSE").read_text()


def test_package_data_covers_every_dashboard_file() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    data = setuptools["package-data"]
    files = [p for d in (TEMPLATES_DIR, STATIC_DIR) for p in d.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for f in files:
        folder = "fedprompt." + ".".join(f.parent.relative_to(ROOT).parts)
        assert folder in setuptools["packages"], f"{folder} is not a listed package"
        patterns = [*data.get("*", []), *data.get(folder, [])]
        assert any(fnmatch.fnmatch(f.name, pat) for pat in patterns), f"{f} is not in package-data"


# -- the view model (pure) ------------------------------------------------------------------------


def _round(
    number: int, attempt: int, state: str, opened: float, closed: float | None, **kw: Any
) -> dict[str, Any]:
    return {
        "round": number,
        "attempt": attempt,
        "state": state,
        "opened_at": opened,
        "closed_at": closed,
        "result_version": number if state == "closed" else None,
        "participants": kw.get("participants", [{"client_id": 1, "uploaded": True}]),
        "stats": kw.get("stats", {}),
        "evaluation": kw.get("evaluation"),
        "closed_by": kw.get("closed_by"),
        "failure_reason": kw.get("failure_reason"),
    }


def test_timeline_shows_failures_retries_and_running_round_newest_first() -> None:
    rounds = [
        _round(1, 1, "failed", 0, 30, failure_reason="deadline passed with 0 update(s)"),
        _round(1, 2, "closed", 30, 40, closed_by="all-uploaded"),
        _round(2, 1, "open", 40, None, participants=[{"client_id": 1, "uploaded": False}]),
    ]
    rows = timeline(rounds, quorum=1, now=100)
    assert [(r["round"], r["attempt"], r["state"]) for r in rows] == [
        (2, 1, "open"),
        (1, 2, "closed"),
        (1, 1, "failed"),
    ]
    assert [r["seconds"] for r in rows] == [60, 10, 30]
    assert rows[0]["running"] and rows[0]["bar_pct"] == 100.0 and rows[1]["bar_pct"] == pytest.approx(16.7)
    assert rows[2]["failure_reason"].startswith("deadline passed")


def test_series_puts_the_initial_evaluation_at_version_0_and_keeps_gaps() -> None:
    rounds = [
        _round(1, 1, "closed", 0, 1, evaluation={"accuracy": 0.7, "loss": 0.5}, stats={"bytes_up": 10}),
        _round(2, 1, "closed", 1, 2, stats={"bytes_up": 20, "train_loss": 0.4}),
    ]
    s = series(rounds, {"accuracy": 0.5, "loss": 0.9, "asr": 0.3})
    assert s["version"] == [0, 1, 2]
    assert s["accuracy"] == [0.5, 0.7, None]
    assert s["asr"] == [0.3, None, None]
    assert s["bytes_up"] == [None, 10.0, 20.0]
    assert s["train_loss"] == [None, None, 0.4]


def test_communication_reads_the_ledger_and_gives_a_ratio_only_when_the_model_size_is_known() -> None:
    rounds = [(1, {"bytes_up": 2000, "bytes_down": 1000, "updates": 2, "participants": 2})]
    spec = {"num_virtual_tokens": 20, "hidden_size": 384}
    status = {"spec": spec, "ledger": ledger(rounds, params_per_client=7680, params_full_model=None)}
    c = communication(status)
    assert c["prompt_parameters"] == 7680 and c["prompt_bytes"] == 30720
    assert c["prompt_shape"] == "20 × 384" and c["method"] == "prompt_tuning"
    assert c["bytes_per_update"] == 1000 and c["ratio"] is None and c["model_parameters"] is None
    known = {"spec": spec, "ledger": ledger(rounds, params_per_client=7680, params_full_model=22_713_216)}
    assert communication(known)["ratio"] == pytest.approx(7680 / 22_713_216)
    assert communication(known)["model_parameters"] == 22_713_216
    assert communication(known)["model_parameters_from"] == "enrolment"  # the spec does not state it
    stated = {**known, "spec": {**spec, "params_full_model": 22_713_216}}
    assert communication(stated)["model_parameters_from"] == "spec"


def test_communication_counts_what_p_tuning_and_prefix_tuning_send() -> None:
    for extra in ({"method": "p_tuning"}, {"method": "prefix_tuning", "num_layers": 6}):
        spec = FederationSpec.model_validate({**SMALL_SPEC, **extra, "params_full_model": 10**7})
        sent = spec.params_communicated()
        assert sent > spec.num_virtual_tokens * spec.hidden_size  # an encoder, or every layer's prefix
        status = {
            "spec": spec.model_dump(),
            "ledger": ledger([], params_per_client=sent, params_full_model=10**7),
        }
        c = communication(status)
        assert c["prompt_parameters"] == sent and c["method"] == extra["method"]
        assert c["ratio"] == pytest.approx(sent / 10**7)


def test_federation_detail_counts_missed_rounds_and_refusals_per_client() -> None:
    status = {
        "id": 1,
        "name": "f",
        "state": "running",
        "paused": False,
        "current_round": 2,
        "rounds_total": 3,
        "latest_version": 1,
        "clients": {"enrolled": 2, "active": 2, "available": 1},
        "spec": {"quorum": 1, "availability_timeout_s": 60},
        "open_round": {
            "round": 2,
            "deadline_at": 500.0,
            "participants": [{"client_id": 2, "uploaded": True}],
        },
    }
    rounds = [
        _round(
            1,
            1,
            "closed",
            0,
            1,
            participants=[{"client_id": 1, "uploaded": False}, {"client_id": 2, "uploaded": True}],
        )
    ]
    training = {"phase": "training", "round": 2, "step": 5, "total_steps": 50}
    clients = [
        {"id": 1, "name": "a", "revoked": False, "last_seen_at": 0.0, "num_samples": 1, "state": "stale"},
        {"id": 2, "name": "b", "revoked": False, "last_seen_at": 90.0, "num_samples": 1, "state": "training"}
        | {"activity": training},
    ]
    d = federation_detail(status, rounds, clients, None, {1: 4}, now=100.0)
    assert [(c["id"], c["status"], c["missed"], c["refused"]) for c in d["clients"]] == [
        (1, "stale", 1, 4),
        (2, "training", 0, 0),
    ]
    assert [c["doing"] for c in d["clients"]] == ["no heartbeat yet", "training round 2: step 5 of 50"]
    assert d["participants"] == [{"client_id": 2, "name": "b", "uploaded": True}] and d["uploaded"] == 1
    assert d["deadline_at"] == 500.0 and d["has_asr"] is False


@pytest.mark.parametrize(
    ("fn", "arg", "text"),
    [
        (fmt_bytes, 30720, "30.0 KiB"),
        (fmt_bytes, 512, "512 B"),
        (fmt_bytes, None, "—"),
        (fmt_duration, 65, "1 m 05 s"),
        (fmt_duration, 7300, "2 h 01 m"),
        (fmt_pct, 0.8123, "81.2 %"),
        (fmt_pct, None, "—"),
    ],
)
def test_filters(fn: Any, arg: Any, text: str) -> None:
    assert fn(arg) == text


def test_pick_federation_prefers_the_asked_then_the_newest_running() -> None:
    feds = [{"id": 1, "state": "running"}, {"id": 2, "state": "running"}, {"id": 3, "state": "waiting"}]
    assert pick_federation(feds, 1) == 1
    assert pick_federation(feds, 99) == 2
    assert pick_federation(feds[2:], None) == 3
    assert pick_federation([], None) is None


def test_a_secure_round_shows_each_stage_its_deadline_and_drops_by_name() -> None:
    live = {
        "stage": "masked",
        "completed": {"keys": [1, 2, 3, 4], "shares": [1, 2, 3]},
        "dropped_at": {"4": "shares"},
        "stage_deadline_at": 130.0,
    }
    running = {"closed_at": None, "secure_aggregation": live}
    got = secure_summary(running, {1: "oslo", 2: "bergen", 3: "tromsø", 4: "bodø"})
    assert got == {
        "stage": "masked",
        "deadline_at": 130.0,
        "stages": [("keys", 4), ("shares", 3)],
        "survivors": None,
        "dropped": [("bodø", "shares")],
    }
    done = {
        "closed_at": 200.0,
        "stats": {
            "secure_aggregation": {
                "completed": {**live["completed"], "masked": [1, 2], "consistency": [1, 2], "unmask": [1, 2]},
                "dropped_at": {"3": "masked", "4": "shares"},
            }
        },
    }
    closed = secure_summary(done, {1: "oslo"})
    assert closed is not None and closed["stage"] is None and closed["deadline_at"] is None
    assert closed["stages"][-1] == ("unmask", 2) and closed["survivors"] == 2
    assert closed["dropped"] == [("client 3", "masked"), ("client 4", "shares")]  # names unknown: ids


def test_the_site_summary_names_each_state_in_words() -> None:
    from fedprompt.coordinator.dashboard.view import site_summary

    clients = [{"revoked": False, "state": s} for s in ("live", "live", "stale", "revoked")]
    assert site_summary(clients) == "2 live · 0 training · 1 stale · 1 revoked"
    assert site_summary([]) == "0 live · 0 training"
