"""The worker's own HTTP surface (issue 36): behind a token on every path but /healthz, refused on a
non-loopback address without one, and /status without the site's local evaluation details unless
asked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import typer
from fastapi.testclient import TestClient
from fedprompt.worker.agent import WorkerStatus
from fedprompt.worker.app import WorkerMetrics, create_app
from fedprompt.worker.cli import api_token
from fedprompt.worker.cli import app as worker_cli
from typer.testing import CliRunner

TOKEN = "worker-api-token-0123456789"


def _pool(*statuses: WorkerStatus) -> Any:
    agents = [
        SimpleNamespace(status=s, metrics=None, config=SimpleNamespace(name=f"site-{i}"))
        for i, s in enumerate(statuses)
    ]
    return SimpleNamespace(
        agents=agents,
        start=lambda: None,
        stop=lambda: None,
        status=lambda: [{"name": a.config.name, **a.status.as_dict()} for a in agents],
    )


def _status() -> WorkerStatus:
    return WorkerStatus(
        state="idle",
        client_id=7,
        federation_id=1,
        round=2,
        num_train=1234,
        num_eval=100,
        last_eval={"version": 2, "accuracy": 0.81, "num_samples": 100, "confusion": [[40, 10], [9, 41]]},
    )


def test_with_a_token_every_path_but_healthz_needs_it() -> None:
    with TestClient(create_app(_pool(_status()), WorkerMetrics(), token=TOKEN)) as api:
        assert api.get("/healthz").status_code == 200
        for path in ("/status", "/metrics", "/docs", "/openapi.json", "/redoc"):
            for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": TOKEN}):
                refused = api.get(path, headers=headers)
                assert refused.status_code == 401, (path, headers)
                assert refused.headers["content-type"] == "application/problem+json"
                assert "FEDPROMPT_WORKER_TOKEN" in refused.json()["detail"]
            assert api.get(path, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200, path


def test_status_leaves_out_the_sites_evaluation_details_unless_asked() -> None:
    with TestClient(create_app(_pool(_status()), WorkerMetrics())) as api:
        brief = api.get("/status").json()
        full = api.get("/status", params={"detail": "full"}).json()
    assert brief["last_eval"] == {"version": 2, "accuracy": 0.81}
    assert "num_train" not in brief and "num_eval" not in brief and brief["round"] == 2
    assert full["last_eval"]["confusion"] == [[40, 10], [9, 41]] and full["num_train"] == 1234
    with TestClient(create_app(_pool(_status(), _status()), WorkerMetrics())) as api:
        clients = api.get("/status").json()["clients"]
    assert [c["name"] for c in clients] == ["site-0", "site-1"]
    assert all("confusion" not in c["last_eval"] and "num_eval" not in c for c in clients)


def test_a_non_loopback_address_needs_a_token(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("FEDPROMPT_WORKER_TOKEN", raising=False)
    assert api_token("127.0.0.1", None) is None and api_token("localhost", None) is None
    assert api_token("::1", None) is None
    for host in ("0.0.0.0", "10.1.2.3", "worker.example"):
        with pytest.raises(typer.Exit):
            api_token(host, None)
    monkeypatch.setenv("FEDPROMPT_WORKER_TOKEN", TOKEN)
    assert api_token("0.0.0.0", None) == TOKEN
    (tmp_path / "token").write_text(TOKEN + "-from-file\n")
    assert api_token("0.0.0.0", tmp_path / "token") == TOKEN + "-from-file"
    monkeypatch.setenv("FEDPROMPT_WORKER_TOKEN", "short")
    with pytest.raises(typer.Exit):
        api_token("127.0.0.1", None)


def test_the_cli_refuses_before_loading_anything(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("FEDPROMPT_WORKER_TOKEN", raising=False)
    monkeypatch.delenv("FEDPROMPT_WORKER_TOKEN_FILE", raising=False)
    result = CliRunner().invoke(
        worker_cli, ["pool", "--config", str(tmp_path / "none.json"), "--host", "0.0.0.0"]
    )
    assert result.exit_code == 2
    assert "FEDPROMPT_WORKER_TOKEN" in result.output and "Traceback" not in result.output
