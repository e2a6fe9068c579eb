"""Per-IP rate limits: enrolment and failed authentications answer 429 problem+json with Retry-After."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.hosting.ratelimit import RateLimiter, parse_limits
from fedprompt.coordinator.persistence.migrate import upgrade
from pydantic import ValidationError

from tests.helpers import ADMIN, SMALL_SPEC

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
# An admin token short enough to guess at (under UNGUESSABLE_CHARS): it stays behind the limit.
SHORT_ADMIN = "short-admin-token-20"
SHORT_HEADERS = {"Authorization": f"Bearer {SHORT_ADMIN}"}


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    """Build an app with given settings; clients from any address share its limiter."""
    url = f"sqlite:///{tmp_path / 'rl.db'}"
    upgrade(url)
    opened: list[TestClient] = []

    def build(**overrides: Any) -> Any:
        settings = {"database_url": url, "admin_token": ADMIN, "data_dir": tmp_path, **overrides}
        app = create_app(Settings(**settings), sweep=False)

        def client(ip: str = "198.51.100.7") -> TestClient:
            tc = TestClient(app, client=(ip, 40000))
            tc.__enter__()
            opened.append(tc)
            return tc

        return client

    yield build
    for tc in opened:
        tc.__exit__(None, None, None)


def _federation(api: TestClient, admin: dict[str, str] = ADMIN_HEADERS) -> tuple[int, str]:
    fid = api.post("/api/v1/federations", json={**SMALL_SPEC, "min_clients": 50}, headers=admin).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=admin).json()["token"]
    return fid, token


def _enrol(api: TestClient, fid: int, token: str, name: str) -> Any:
    return api.post(
        f"/api/v1/federations/{fid}/clients",
        json={"name": name, "num_samples": 1},
        headers={"Authorization": f"Bearer {token}"},
    )


def _assert_429(resp: Any) -> int:
    assert resp.status_code == 429, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == 429 and body["title"] == "Too many requests"
    retry_after = int(resp.headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert body["retry_after"] == retry_after
    return retry_after


def test_enrolment_is_limited_per_address(make: Any) -> None:
    client = make(enrolment_rate_limit="3/minute")
    site, elsewhere = client(), client("203.0.113.9")
    fid, token = _federation(site)
    for i in range(3):
        assert _enrol(site, fid, token, f"s{i}").status_code == 201
    resp = _enrol(site, fid, token, "one-too-many")
    _assert_429(resp)
    assert "too many enrolments" in resp.json()["detail"]
    # Another address has its own allowance; the refused attempt enrolled nobody.
    assert _enrol(elsewhere, fid, token, "other-site").status_code == 201
    names = [c["name"] for c in site.get(f"/api/v1/federations/{fid}/clients", headers=ADMIN_HEADERS).json()]
    assert names == ["s0", "s1", "s2", "other-site"]


def test_failed_authentications_block_the_address_even_for_a_valid_short_token(make: Any) -> None:
    client = make(failed_auth_rate_limit="3/minute", admin_token=SHORT_ADMIN)
    attacker, operator = client(), client("203.0.113.9")
    guesses = [
        attacker.get("/api/v1/federations", headers={"Authorization": "Bearer guess-1-not-the-token"}),
        attacker.get("/api/v1/federations/1/task", headers={"Authorization": "Bearer fpc_guess"}),
        attacker.get("/api/v1/federations"),  # no token at all
    ]
    assert [r.status_code for r in guesses] == [403, 401, 401]
    _assert_429(attacker.get("/api/v1/federations", headers=SHORT_HEADERS))
    _assert_429(attacker.get("/api/v1/federations", headers={"Authorization": "Bearer guess-4"}))
    # Public routes are not behind a token, so not behind the limit either.
    assert attacker.get("/healthz").status_code == 200
    assert operator.get("/api/v1/federations", headers=SHORT_HEADERS).status_code == 200


def test_credentials_too_long_to_guess_are_checked_past_the_limit(make: Any) -> None:
    """Others' failures from a shared address (a NAT) do not lock out the holder of a credential
    nobody can guess: the issued client tokens, the session cookie, an admin token of 32+ characters."""
    client = make(failed_auth_rate_limit="3/minute", enrolment_rate_limit="100/minute")
    shared = client()
    fid, enrolment = _federation(shared)
    site = {"Authorization": f"Bearer {_enrol(shared, fid, enrolment, 'site').json()['token']}"}
    login = shared.post("/dashboard/login", data={"token": ADMIN}, follow_redirects=False)
    assert login.status_code == 303
    for guess in ("guess-1", "guess-2", "guess-3"):
        assert (
            shared.get("/api/v1/federations", headers={"Authorization": f"Bearer {guess}"}).status_code == 403
        )
    _assert_429(shared.get("/api/v1/federations", headers={"Authorization": "Bearer guess-4"}))
    _assert_429(_enrol(shared, fid, "fpe_guess", "x"))
    assert shared.get("/api/v1/federations", headers=ADMIN_HEADERS).status_code == 200
    assert shared.get(f"/api/v1/federations/{fid}/spec", headers=site).status_code == 200
    assert shared.get("/dashboard/live").status_code == 200  # the session cookie
    assert _enrol(shared, fid, enrolment, "another-site").status_code == 201
    relogin = shared.post("/dashboard/login", data={"token": ADMIN}, follow_redirects=False)
    assert relogin.status_code == 303
    # a long guess is checked, refused and still counted; it cannot be the admin token
    long_guess = {"Authorization": "Bearer " + "g" * 40}
    assert shared.get("/api/v1/federations", headers=long_guess).status_code == 403
    _assert_429(shared.get("/api/v1/federations", headers={"Authorization": "Bearer guess-5"}))


def test_refused_enrolment_tokens_and_dashboard_logins_count_as_failures(make: Any) -> None:
    client = make(failed_auth_rate_limit="3/minute", admin_token=SHORT_ADMIN)
    api = client()
    fid, _ = _federation(api, SHORT_HEADERS)
    assert _enrol(api, fid, "fpe_guessed", "x").status_code == 401
    assert _enrol(api, fid, "fpe_guessed-again", "x").status_code == 401
    assert api.post("/dashboard/login", data={"token": "guess"}, follow_redirects=False).status_code == 401
    page = api.post("/dashboard/login", data={"token": SHORT_ADMIN}, follow_redirects=False)
    assert page.status_code == 429
    assert int(page.headers["retry-after"]) >= 1
    assert "Too many failed" in page.text
    _assert_429(_enrol(api, fid, "fpe_guess", "x"))


def test_successful_calls_never_count(make: Any) -> None:
    client = make(failed_auth_rate_limit="2/minute", enrolment_rate_limit="100/minute")
    api = client()
    fid, token = _federation(api)
    enrolled = _enrol(api, fid, token, "site").json()
    client_headers = {"Authorization": f"Bearer {enrolled['token']}"}
    for _ in range(30):
        assert api.get("/api/v1/federations", headers=ADMIN_HEADERS).status_code == 200
        assert api.get(f"/api/v1/federations/{fid}/spec", headers=client_headers).status_code == 200


def test_the_window_moves_on(make: Any) -> None:
    client = make(failed_auth_rate_limit="2/second", admin_token=SHORT_ADMIN)
    api = client()
    for _ in range(2):
        assert api.get("/api/v1/federations").status_code == 401
    _assert_429(api.get("/api/v1/federations", headers=SHORT_HEADERS))
    time.sleep(1.1)
    assert api.get("/api/v1/federations", headers=SHORT_HEADERS).status_code == 200


def test_limits_can_be_turned_off(make: Any) -> None:
    client = make(rate_limits=False, failed_auth_rate_limit="1/minute", enrolment_rate_limit="1/minute")
    api = client()
    fid, token = _federation(api)
    for i in range(5):
        assert api.get("/api/v1/federations", headers={"Authorization": "Bearer nope"}).status_code == 403
        assert _enrol(api, fid, token, f"s{i}").status_code == 201


def test_defaults_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = Settings()
    assert defaults.rate_limits is True
    assert [str(i) for i in parse_limits(defaults.enrolment_rate_limit)] == ["120 per 1 minute"]
    assert [str(i) for i in parse_limits(defaults.failed_auth_rate_limit)] == ["60 per 1 minute"]
    monkeypatch.setenv("FEDPROMPT_RATE_LIMITS", "false")
    monkeypatch.setenv("FEDPROMPT_ENROLMENT_RATE_LIMIT", "10/minute;100/hour")
    settings = Settings()
    assert settings.rate_limits is False
    assert len(parse_limits(settings.enrolment_rate_limit)) == 2


@pytest.mark.parametrize("text", ["", "lots", "10 per fortnight", "-1/minute"])
def test_a_malformed_limit_is_a_clear_configuration_error(text: str) -> None:
    with pytest.raises(ValidationError, match="invalid rate limit"):
        Settings(failed_auth_rate_limit=text)


def test_limiter_keys_by_address_and_reports_the_wait() -> None:
    limiter = RateLimiter(enrolment="2/minute", failed_auth="1/hour")
    limiter.hit_enrolment("a")
    limiter.hit_enrolment("a")
    limiter.hit_enrolment("b")
    with pytest.raises(Exception) as refused:
        limiter.hit_enrolment("a")
    assert refused.value.status == 429 and 1 <= refused.value.retry_after <= 60
    limiter.check_failed_auth("a")
    limiter.record_failed_auth("a")
    with pytest.raises(Exception) as blocked:
        limiter.check_failed_auth("a")
    assert 3500 <= blocked.value.retry_after <= 3600
    limiter.check_failed_auth("b")
