"""Security properties of the coordinator's API, one test per claim in docs/security.md.

One authorisation dependency per route; a client acts only as itself; tokens are stored as
sha256 and compared in constant time; request bodies are limited before they are read; no CORS;
the dashboard needs the admin token. Rate limits: tests/coordinator/test_ratelimit.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from fedprompt.coordinator.api import auth, deps, session
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import ConfigError, Settings, require_admin_token
from fedprompt.coordinator.logic.tokens import hash_token
from fedprompt.coordinator.persistence.db import Base
from fedprompt.coordinator.persistence.migrate import upgrade
from sqlalchemy import select, text

from tests.coordinator.test_api import snapshot
from tests.coordinator.test_authz_matrix import ADMIN_ONLY, CLIENT, EITHER, ENROL, PUBLIC, ROUTES
from tests.helpers import ADMIN, SMALL_SPEC, federation_with_clients, update_blob

ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
SCOPE_OF = {
    ADMIN_ONLY: deps.require_admin,
    CLIENT: deps.require_client,
    EITHER: deps.require_admin_or_client,
    ENROL: deps.require_enrolment,
}
UPLOAD_LIMIT, REQUEST_LIMIT = 4096, 2048


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'sec.db'}"
    upgrade(url)
    settings = Settings(
        database_url=url,
        admin_token=ADMIN,
        data_dir=tmp_path,
        max_upload_bytes=UPLOAD_LIMIT,
        max_request_bytes=REQUEST_LIMIT,
    )
    app = create_app(settings, sweep=False)
    with TestClient(app) as api:
        fid, enrol, clients = federation_with_clients(api, 2)
        yield {"api": api, "app": app, "fid": fid, "enrol": enrol, "clients": clients}


def _api_routes(app: Any) -> list[Any]:
    """Every API route with its effective dependencies (router- and app-level ones included)."""
    return [c for c in iter_route_contexts(app.routes) if isinstance(c.original_route, APIRoute)]


def _auth_dependencies(route: Any) -> list[Any]:
    found, stack = [], [route.dependant]
    while stack:
        dependant = stack.pop()
        if dependant.call in deps.AUTH_DEPENDENCIES:
            found.append(dependant.call)
        stack.extend(dependant.dependencies)
    return found


def test_every_api_route_has_exactly_the_one_authorisation_dependency_of_its_scope() -> None:
    app = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False)
    seen = set()
    for route in _api_routes(app):
        if not route.include_in_schema:
            continue
        for method in route.methods - {"HEAD"}:
            scope = ROUTES[(method, route.path)]
            seen.add((method, route.path))
            expected = [] if scope == PUBLIC else [SCOPE_OF[scope]]
            assert _auth_dependencies(route) == expected, f"{method} {route.path}"
    assert seen == set(ROUTES)


def test_the_dashboard_s_admin_routes_use_the_same_dependency() -> None:
    app = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False)
    live = next(r for r in _api_routes(app) if r.path == "/dashboard/live")
    assert _auth_dependencies(live) == [deps.require_admin]


def test_openapi_names_the_token_each_route_takes() -> None:
    spec = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False).openapi()
    assert set(spec["components"]["securitySchemes"]) == {"admin", "client", "enrolment"}
    expected = {
        PUBLIC: None,
        ADMIN_ONLY: [{"admin": []}],
        CLIENT: [{"client": []}],
        EITHER: [{"admin": []}, {"client": []}],
        ENROL: [{"enrolment": []}],
    }
    for (method, path), scope in ROUTES.items():
        assert spec["paths"][path][method.lower()].get("security") == expected[scope], f"{method} {path}"


def test_client_routes_take_no_client_id_from_the_caller() -> None:
    """A client is who its token says: no client route has a parameter or body field naming one."""
    spec = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False).openapi()
    for (method, path), scope in ROUTES.items():
        if scope not in (CLIENT, EITHER):
            continue
        op = spec["paths"][path][method.lower()]
        names = {p["name"] for p in op.get("parameters", [])}
        assert names <= {"fid", "number", "version", "wait", "stage"}, (method, path, names)
        ref = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
        body = spec["components"]["schemas"].get(ref.get("$ref", "/").rsplit("/", 1)[1], {})
        assert not {"client_id", "cid", "client"} & set(body.get("properties", {})), (method, path)


def test_a_client_acts_only_as_itself(world: dict[str, Any]) -> None:
    api, fid = world["api"], world["fid"]
    me, other = world["clients"]
    mine = {"Authorization": f"Bearer {me['token']}"}
    # Metadata that claims to be the other client is only metadata: the update is recorded as mine.
    blob = update_blob(SMALL_SPEC, 1, base_version=0)
    resp = api.put(f"/api/v1/federations/{fid}/rounds/1/update", content=blob, headers=mine)
    assert resp.status_code == 201 and resp.json()["client_id"] == me["client_id"]
    report = api.post(
        f"/api/v1/federations/{fid}/rounds/0/evaluation",
        json={"num_samples": 3, "accuracy": 0.5},
        headers=mine,
    )
    assert report.status_code == 201
    participants = api.get(f"/api/v1/federations/{fid}/rounds/1", headers=ADMIN_HEADERS).json()[
        "participants"
    ]
    uploaded = {p["client_id"]: p["uploaded"] for p in participants}
    assert uploaded == {me["client_id"]: True, other["client_id"]: False}
    clients = {
        c["id"]: c for c in api.get(f"/api/v1/federations/{fid}/clients", headers=ADMIN_HEADERS).json()
    }
    assert clients[me["client_id"]]["updates"] == 1 and clients[other["client_id"]]["updates"] == 0
    # Client tokens open nothing of the operator's, and nothing in another federation.
    before = snapshot(api)
    assert (
        api.delete(f"/api/v1/federations/{fid}/clients/{other['client_id']}", headers=mine).status_code == 403
    )
    assert api.post(f"/api/v1/federations/{fid}/rounds/1/close", headers=mine).status_code == 403
    fid2 = api.post("/api/v1/federations", json={**SMALL_SPEC, "name": "b"}, headers=ADMIN_HEADERS).json()[
        "id"
    ]
    before = snapshot(api)
    assert api.get(f"/api/v1/federations/{fid2}/task", headers=mine).status_code == 403
    assert (
        api.put(f"/api/v1/federations/{fid2}/rounds/1/update", content=blob, headers=mine).status_code == 403
    )
    assert snapshot(api) == before


def test_tokens_are_stored_only_as_their_sha256(world: dict[str, Any]) -> None:
    api = world["api"]
    secrets = [world["enrol"], ADMIN] + [c["token"] for c in world["clients"]]
    sessions = world["app"].state.service.sessions
    dump = []
    with sessions() as s:
        for table in Base.metadata.sorted_tables:
            dump.extend(repr(tuple(row)) for row in s.execute(select(table)).all())
        token_hashes = set(s.execute(text("SELECT token_hash FROM clients")).scalars())
        token_hashes |= set(s.execute(text("SELECT token_hash FROM enrollment_tokens")).scalars())
    everything = "\n".join(dump)
    assert everything, "the database has rows"
    for secret in secrets:
        assert secret not in everything
    expected = {hashlib.sha256(t.encode()).hexdigest() for t in secrets if t != ADMIN}
    assert token_hashes == expected
    assert hash_token(world["enrol"]) == hashlib.sha256(world["enrol"].encode()).hexdigest()
    assert api.get("/api/v1/federations", headers=ADMIN_HEADERS).status_code == 200


def test_admin_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    settings = Settings(database_url="sqlite://", admin_token=ADMIN)
    assert auth.is_admin_token(ADMIN, settings) and not auth.is_admin_token(ADMIN[:-1] + "x", settings)
    assert calls == [(ADMIN.encode(), ADMIN.encode()), ((ADMIN[:-1] + "x").encode(), ADMIN.encode())]


def _asgi_call(
    app: Any, method: str, path: str, headers: dict[str, str], chunks: list[bytes]
) -> tuple[int, int]:
    """Call the app directly; returns (status, how many body chunks it pulled)."""
    pulled = 0
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("192.0.2.1", 5000),
        "server": ("testserver", 80),
        "state": {},
    }
    asyncio.run(app(scope, receive, send))
    return status, pulled


def test_a_declared_oversized_body_is_refused_before_a_byte_is_read(world: dict[str, Any]) -> None:
    app, fid = world["app"], world["fid"]
    token = world["clients"][0]["token"]
    cases = [
        ("POST", "/api/v1/federations", REQUEST_LIMIT + 1, ADMIN),
        ("PUT", f"/api/v1/federations/{fid}/rounds/1/update", UPLOAD_LIMIT + 1, token),
        ("PUT", f"/api/v1/federations/{fid}/prompts/0", UPLOAD_LIMIT + 1, ADMIN),
    ]
    for method, path, size, bearer in cases:
        headers = {"content-length": str(size), "authorization": f"Bearer {bearer}"}
        status, pulled = _asgi_call(app, method, path, headers, [b"x" * 1024] * 4)
        assert (status, pulled) == (413, 0), (method, path)
    # A route that reads no body never receives one, whatever it declares.
    status, pulled = _asgi_call(app, "GET", "/healthz", {"content-length": str(10**9)}, [b"x" * 1024] * 4)
    assert (status, pulled) == (200, 0)


def test_a_streamed_body_is_cut_off_at_the_limit(world: dict[str, Any]) -> None:
    app, fid = world["app"], world["fid"]
    before = snapshot(world["api"])
    chunks = [b"{" + b" " * 1023] + [b" " * 1024] * 20  # no Content-Length: counted as it arrives
    status, pulled = _asgi_call(
        app, "POST", "/api/v1/federations", {"authorization": f"Bearer {ADMIN}"}, chunks
    )
    assert status == 413 and pulled == 3  # the chunk that crossed 2048 bytes was the last one read
    token = world["clients"][0]["token"]
    path = f"/api/v1/federations/{fid}/rounds/1/update"
    status, pulled = _asgi_call(app, "PUT", path, {"authorization": f"Bearer {token}"}, chunks)
    assert status == 413 and pulled == 5
    assert snapshot(world["api"]) == before


def test_json_bodies_have_their_own_smaller_limit(world: dict[str, Any]) -> None:
    api, fid = world["api"], world["fid"]
    spec = {**SMALL_SPEC, "name": "x" * REQUEST_LIMIT}
    resp = api.post("/api/v1/federations", content=json.dumps(spec), headers=ADMIN_HEADERS)
    assert resp.status_code == 413 and resp.headers["content-type"].startswith("application/problem+json")
    assert "FEDPROMPT_MAX_REQUEST_BYTES" in resp.json()["detail"]
    # An upload between the two limits is not refused for its size (metrics pad its header).
    big = update_blob(SMALL_SPEC, 2, base_version=0, metrics={f"m{i:04d}": 0.5 for i in range(120)})
    assert REQUEST_LIMIT < len(big) < UPLOAD_LIMIT
    token = world["clients"][1]["token"]
    up = api.put(
        f"/api/v1/federations/{fid}/rounds/1/update",
        content=big,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert up.status_code == 201, up.text


def test_no_cross_origin_access(world: dict[str, Any]) -> None:
    api = world["api"]
    preflight = api.options(
        "/api/v1/federations",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code >= 400
    assert not any(h.startswith("access-control-") for h in preflight.headers)
    simple = api.get("/api/v1/federations", headers={**ADMIN_HEADERS, "Origin": "https://evil.example"})
    assert simple.status_code == 200
    assert not any(h.startswith("access-control-") for h in simple.headers)


def test_dashboard_needs_the_admin_token(world: dict[str, Any]) -> None:
    api = world["api"]
    client_token = world["clients"][0]["token"]
    assert api.get("/dashboard", follow_redirects=False).headers["location"] == "/dashboard/login"
    assert api.get("/dashboard/live").status_code == 401
    assert api.get("/dashboard/live", headers={"Authorization": f"Bearer {client_token}"}).status_code == 403
    api.cookies.set(session.SESSION_COOKIE, "v1.99999999999.forged")
    assert api.get("/dashboard", follow_redirects=False).status_code == 303
    assert api.get("/dashboard/live").status_code == 401
    api.cookies.clear()
    login = api.post("/dashboard/login", data={"token": client_token}, follow_redirects=False)
    assert login.status_code == 401 and session.SESSION_COOKIE not in login.cookies
    ok = api.post("/dashboard/login", data={"token": ADMIN}, follow_redirects=False)
    assert ok.status_code == 303 and api.get("/dashboard/live").status_code == 200


def test_no_admin_token_means_no_start_outside_dev(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FEDPROMPT_ADMIN_TOKEN is not set"):
        require_admin_token(Settings(data_dir=tmp_path), dev=False)
    dev = require_admin_token(Settings(data_dir=tmp_path), dev=True)
    assert len(dev.admin_secret()) >= 32 and (tmp_path / "admin-token").stat().st_mode & 0o077 == 0


def test_openapi_documents_problem_json_for_every_error() -> None:
    spec = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False).openapi()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if code.startswith("4"):
                    assert list(response.get("content", {})) == ["application/problem+json"], (
                        method,
                        path,
                        code,
                    )
            if path.startswith("/api/"):
                assert {"401", "403", "413", "422", "429"} <= set(op["responses"]), (method, path)
