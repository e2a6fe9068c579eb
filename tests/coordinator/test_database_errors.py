"""A database that cannot serve a request now (pool exhausted, SQLite busy, server gone) is a 503
with Retry-After that clients retry, never a 500, and nothing is half-written."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy.exc
from fastapi.testclient import TestClient

from tests.helpers import ADMIN

AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _raise(exc: Exception) -> Any:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    return fail


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (
            sqlalchemy.exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"),
            "no database connection",
        ),
        (
            sqlalchemy.exc.OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked")),
            "database error",
        ),
    ],
)
def test_database_busy_is_503_with_retry_after(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, exc: Exception, reason: str
) -> None:
    service = api.app.state.service  # type: ignore[attr-defined]
    monkeypatch.setattr(service.federations, "create_federation", _raise(exc))
    resp = api.post(
        "/api/v1/federations", json={"name": "busy", "num_virtual_tokens": 2, "hidden_size": 8}, headers=AUTH
    )
    assert resp.status_code == 503
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.headers["retry-after"] == "2"
    body = resp.json()
    assert reason in body["detail"] and "retry" in body["detail"]
    assert body["retry_after"] == 2
    monkeypatch.undo()
    assert api.get("/api/v1/federations", headers=AUTH).json() == []


def test_503_is_documented_on_api_routes(api: TestClient) -> None:
    schema = api.get("/openapi.json").json()
    create = schema["paths"]["/api/v1/federations"]["post"]["responses"]
    assert "application/problem+json" in create["503"]["content"]


def test_an_emptied_database_is_a_503_naming_the_migration(api: TestClient, db_url: str) -> None:
    """A database recreated empty under a running coordinator: a problem+json naming the fix, not a 500."""
    from fedprompt.coordinator.persistence.migrate import upgrade

    engine = sqlalchemy.create_engine(db_url)
    tables = sqlalchemy.MetaData()
    tables.reflect(engine)
    tables.drop_all(engine)
    engine.dispose()
    for method, path in (("GET", "/api/v1/federations"), ("GET", "/api/v1/federations/1")):
        resp = api.request(method, path, headers=AUTH)
        assert resp.status_code == 503, resp.text
        assert resp.headers["content-type"] == "application/problem+json"
        assert "fedprompt-coordinator migrate" in resp.json()["detail"]
    upgrade(db_url)
    assert api.get("/api/v1/federations", headers=AUTH).json() == []


@pytest.mark.parametrize("method", ["DELETE", "OPTIONS", "PATCH"])
def test_a_405_names_every_method_of_the_path(api: TestClient, method: str) -> None:
    resp = api.request(method, "/api/v1/federations", headers=AUTH)
    assert resp.status_code == 405
    assert resp.headers["content-type"] == "application/problem+json"
    allow = {m.strip() for m in resp.headers["allow"].split(",")}
    assert {"GET", "POST"} <= allow and method not in allow
    assert "GET" in resp.json()["detail"] and "POST" in resp.json()["detail"]
