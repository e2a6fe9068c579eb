"""Logout, proxies, revocation across replicas, and what an error writes: real `serve` processes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.helpers import ADMIN
from tests.security.conftest import (
    ADMIN_H,
    BACKENDS,
    assert_clean_log,
    database,
    populate,
    serve,
    snapshot,
)

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CSRF = {"X-Requested-With": "fedprompt-dashboard"}


def _login(url: str) -> str:
    resp = httpx.post(f"{url}/dashboard/login", content=f"token={ADMIN}".encode(), headers=FORM)
    assert resp.status_code == 303
    return resp.cookies["fedprompt_session"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_logout_revokes_the_session_on_every_replica(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pg = request.getfixturevalue("pg_server") if backend == "postgres" else None
    with database(backend, tmp_path, pg) as db, serve(db, tmp_path) as a, serve(db, tmp_path) as b:
        cookie = _login(a.url)
        other = _login(b.url)  # a second session, which stays valid
        for server in (a, b):
            assert (
                httpx.get(f"{server.url}/dashboard/live", cookies={"fedprompt_session": cookie}).status_code
                == 200
            )

        offset = a.log_size()
        out = httpx.post(f"{a.url}/dashboard/logout", cookies={"fedprompt_session": cookie})
        assert out.status_code == 303 and 'fedprompt_session=""' in out.headers["set-cookie"]

        # the cookie kept by an attacker (or another tab) is refused by both replicas from now on
        for server in (a, b):
            live = httpx.get(f"{server.url}/dashboard/live", cookies={"fedprompt_session": cookie})
            assert live.status_code == 401 and live.headers["content-type"].startswith(
                "application/problem+json"
            )
            page = httpx.get(f"{server.url}/dashboard", cookies={"fedprompt_session": cookie})
            assert page.status_code == 303 and page.headers["location"] == "/dashboard/login"
            changed = httpx.post(
                f"{server.url}/api/v1/federations",
                json={},
                cookies={"fedprompt_session": cookie},
                headers=CSRF,
            )
            assert changed.status_code == 401
        assert httpx.get(f"{b.url}/dashboard/live", cookies={"fedprompt_session": other}).status_code == 200
        assert_clean_log(a.log_since(offset), [ADMIN, cookie, other])


@pytest.mark.parametrize("trusted", ["", "127.0.0.1"])
def test_x_forwarded_for_from_loopback_is_not_believed_by_default(trusted: str, tmp_path: Path) -> None:
    env = {"FEDPROMPT_FAILED_AUTH_RATE_LIMIT": "3/minute", "FEDPROMPT_TRUSTED_PROXIES": trusted}
    with serve(f"sqlite:///{tmp_path / 'x.db'}", tmp_path, env) as server:
        statuses = []
        for i in range(8):  # a new address per guess
            resp = httpx.post(
                f"{server.url}/dashboard/login",
                content=b"token=guess-" + str(i).encode(),
                headers={**FORM, "X-Forwarded-For": f"203.0.113.{i}"},
            )
            statuses.append(resp.status_code)
    if trusted:  # a deployment that names its proxy: each forwarded address has its own allowance
        assert statuses == [401] * 8
    else:  # the default: the connection's own address counts, whatever the header says
        assert statuses[:3] == [401] * 3 and set(statuses[3:]) == {429}


# Every write a client makes: each re-checks the caller's standing in its own transaction.
CLIENT_WRITES = {
    "evaluation": ("POST", "/rounds/0/evaluation", {"json": {"num_samples": 5, "accuracy": 0.99}}),
    "model-parameters": ("PUT", "/model-parameters", {"json": {"model_parameters": 22_713_216}}),
}


@pytest.mark.parametrize("write", sorted(CLIENT_WRITES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_revoked_clients_write_is_refused_by_a_replica_that_still_caches_it(
    backend: str, write: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pg = request.getfixturevalue("pg_server") if backend == "postgres" else None
    with database(backend, tmp_path, pg) as db, serve(db, tmp_path) as a, serve(db, tmp_path) as b:
        fid, _, clients = populate(a.url)
        victim = clients[2]
        auth = {"Authorization": f"Bearer {victim['token']}"}
        assert (
            httpx.get(f"{b.url}/api/v1/federations/{fid}/spec", headers=auth).status_code == 200
        )  # b caches it
        revoked = httpx.delete(
            f"{a.url}/api/v1/federations/{fid}/clients/{victim['client_id']}", headers=ADMIN_H
        )
        assert revoked.status_code == 204
        before = snapshot(db)
        method, path, kwargs = CLIENT_WRITES[write]
        answer = httpx.request(method, f"{b.url}/api/v1/federations/{fid}{path}", headers=auth, **kwargs)
        assert answer.status_code == 403 and "revoked" in answer.json()["detail"], answer.text
        assert snapshot(db) == before


@pytest.mark.postgres
def test_an_error_is_logged_once_without_locals_or_secrets(tmp_path: Path, pg_server: str) -> None:
    # A fault of the server, not of the input: a column the authentication reads is gone (Postgres
    # answers UndefinedColumn, a 500; a whole missing table is a 503 naming the migration). Its trace
    # used to carry every frame's locals: the tokens. No authentication cache: every poll looks the
    # token up (an enrolment caches the token it gives out, which would spare the lookup).
    no_cache = {"FEDPROMPT_AUTH_CACHE_S": "0"}
    with database("postgres", tmp_path, pg_server) as db, serve(db, tmp_path, no_cache) as server:
        fid, enrol, clients = populate(server.url)
        token = clients[0]["token"]
        engine = create_engine(db)
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE clients RENAME COLUMN token_hash TO token_hash_moved"))
        engine.dispose()
        secrets = [ADMIN, enrol, token]
        offset = server.log_size()
        worst = 0.0
        for i in range(60):  # 60 of these added 36 MB of log and a 2.5 s /healthz
            resp = httpx.get(
                f"{server.url}/api/v1/federations/{fid}/task",
                headers={"Authorization": f"Bearer {token}", "X-Request-ID": f"fault-{i}"},
                cookies={"fedprompt_session": "v1.1.cookie-value-xxxxxxxx.ab"},
            )
            assert resp.status_code == 500
            worst = max(worst, httpx.get(f"{server.url}/healthz").elapsed.total_seconds())
        server.wait_logged('"fault-59"', offset)
        time.sleep(0.3)
        logged = server.log_since(offset)
    for secret in secrets:
        assert secret not in logged
    records = [json.loads(line) for line in logged.splitlines()]
    traces = [r for r in records if "exception" in r]
    assert len(traces) == 1, [r["event"] for r in traces]  # once: the 59 repeats are counted, not written
    assert all("locals" not in frame for stack in traces[0]["exception"] for frame in stack["frames"])
    assert "UndefinedColumn" in json.dumps(traces[0])
    assert len(logged.encode()) < 60 * 1024  # the trace and 60 access lines, not 36 MB
    assert worst < 1.0


@pytest.mark.postgres
def test_a_revoked_client_is_refused_by_every_replica_at_once_not_when_its_cache_expires(
    tmp_path: Path, pg_server: str
) -> None:
    # Its reads too: the revoking replica announces the token (NOTIFY), and the other one drops it
    # from its authentication cache, whose entries otherwise live FEDPROMPT_AUTH_CACHE_S (300 s).
    with database("postgres", tmp_path, pg_server) as db, serve(db, tmp_path) as a, serve(db, tmp_path) as b:
        fid, _, clients = populate(a.url)
        victim = clients[2]
        auth = {"Authorization": f"Bearer {victim['token']}"}
        spec = f"{b.url}/api/v1/federations/{fid}/spec"
        assert httpx.get(spec, headers=auth).status_code == 200  # b caches it
        revoked = httpx.delete(
            f"{a.url}/api/v1/federations/{fid}/clients/{victim['client_id']}", headers=ADMIN_H
        )
        assert revoked.status_code == 204
        started = time.monotonic()
        while (
            answer := httpx.get(spec, headers=auth)
        ).status_code == 200 and time.monotonic() - started < 10:
            time.sleep(0.05)
        assert answer.status_code == 403 and "revoked" in answer.json()["detail"], answer.text
        assert time.monotonic() - started < 5  # the announcement, not the cache's 300 s
