"""Structured logs: JSON lines off a terminal, console on one, request and federation ids bound."""

from __future__ import annotations

import io
import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared.logs import configure_logging, path_fields, request_id_from, resolve_format

from tests.helpers import ADMIN, SMALL_SPEC, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Undo configure_logging: root handlers and level, library loggers, structlog's config."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    names = ("httpx", "httpcore", "uvicorn", "uvicorn.error", "uvicorn.access", "fedprompt.access")
    saved = {n: (logging.getLogger(n).level, logging.getLogger(n).propagate) for n in names}
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    for n, (lvl, prop) in saved.items():
        logging.getLogger(n).setLevel(lvl)
        logging.getLogger(n).propagate = prop
    structlog.reset_defaults()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line of the stream parsed as JSON (fails on a line that is not)."""
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_json_lines_off_a_terminal(restore_logging: None) -> None:
    stream = io.StringIO()
    assert configure_logging("info", "auto", stream=stream) == "json"
    logging.getLogger("fedprompt.test").info("plain %s", "stdlib", extra={"federation_id": 3})
    structlog.get_logger("fedprompt.test").info("from_structlog", round=2)
    logging.getLogger("fedprompt.test").debug("below the level")
    out = lines(stream)
    assert [o["event"] for o in out] == ["plain stdlib", "from_structlog"]
    assert out[0]["federation_id"] == 3 and out[0]["level"] == "info" and out[0]["logger"] == "fedprompt.test"
    assert out[1]["round"] == 2 and "timestamp" in out[1]


def test_console_format_on_a_terminal(restore_logging: None) -> None:
    stream = Terminal()
    assert configure_logging("info", "auto", stream=stream) == "console"
    logging.getLogger("fedprompt.test").warning("disk almost full", extra={"federation_id": 1})
    text = stream.getvalue()
    assert "disk almost full" in text and "federation_id" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_static_fields_and_bad_settings(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("warning", "json", stream=stream, static={"client_name": "site-1"})
    logging.getLogger("worker").warning("hello")
    assert lines(stream)[0]["client_name"] == "site-1"
    with pytest.raises(ValueError, match="log format"):
        resolve_format("xml", stream)
    with pytest.raises(ValueError, match="log level"):
        configure_logging("chatty", "json", stream=stream)


def test_request_ids_and_path_fields() -> None:
    assert request_id_from("abc-123") == "abc-123"
    assert len(request_id_from("has spaces and ;")) == 32
    assert len(request_id_from("x" * 200)) == 32
    rid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    assert request_id_from(rid) == rid and request_id_from(rid.replace("-", "")) == rid.replace("-", "")
    # a session id or a bearer token pasted into X-Request-ID is replaced, never logged
    for secret in (secrets.token_urlsafe(16), "fpc_" + secrets.token_urlsafe(32), "x" * 21):
        assert request_id_from(secret) != secret and len(request_id_from(secret)) == 32
    assert path_fields({"fid": "3", "number": "2", "cid": "7", "other": "x"}) == {
        "federation_id": 3,
        "round": 2,
        "client_id": 7,
    }


def test_every_request_logs_one_line_with_its_ids(restore_logging: None, tmp_path: Path) -> None:
    # Prepare
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    upgrade(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path), sweep=False)
    with TestClient(app) as api:
        fid = api.post("/api/v1/federations", json={**SMALL_SPEC, "min_clients": 1}, headers=ADMIN_H).json()[
            "id"
        ]
        token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_H).json()[
            "token"
        ]
        enrolled = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": "solo", "num_samples": 5},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        stream.truncate(0)
        stream.seek(0)

        # Execute: the only participant uploads, which closes round 1 (in the same request)
        resp = api.put(
            f"/api/v1/federations/{fid}/rounds/1/update",
            content=update_blob(SMALL_SPEC, 0, base_version=0),
            headers={"Authorization": f"Bearer {enrolled['token']}", "X-Request-ID": "req-42"},
        )
        fresh = api.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})

    # Assert: the id is echoed; one access line with every id; the round's own line is bound too
    assert resp.status_code == 201 and resp.headers["x-request-id"] == "req-42"
    assert fresh.headers["x-request-id"] != "bad id with spaces" and len(fresh.headers["x-request-id"]) == 32
    out = lines(stream)
    access = [o for o in out if o["event"] == "request" and o.get("request_id") == "req-42"]
    assert len(access) == 1
    assert access[0]["route"] == "/api/v1/federations/{fid}/rounds/{number}/update"
    assert access[0]["status"] == 201 and access[0]["method"] == "PUT"
    assert (access[0]["federation_id"], access[0]["round"], access[0]["client_id"]) == (
        fid,
        1,
        enrolled["client_id"],
    )
    closed = [o for o in out if o["event"] == "round_closed"]
    assert len(closed) == 1
    assert (
        closed[0]["request_id"] == "req-42" and closed[0]["federation_id"] == fid and closed[0]["round"] == 1
    )
    assert closed[0]["closed_by"] == "all-uploaded"
