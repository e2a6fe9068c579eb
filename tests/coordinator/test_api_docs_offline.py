"""/docs and /redoc work with no network (issue 34): every script and style they load is served by the
coordinator (and the worker) itself, none from a CDN."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient


def _worker_app() -> FastAPI:
    from types import SimpleNamespace

    from fedprompt.worker.app import WorkerMetrics, create_app

    pool = SimpleNamespace(agents=[], start=lambda: None, stop=lambda: None)  # no client: the docs only
    return create_app(pool, WorkerMetrics())  # type: ignore[arg-type]


def _assets(client: TestClient, page: str) -> list[str]:
    resp = client.get(page)
    assert resp.status_code == 200, resp.text
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", resp.text) + re.findall(
        r"""url:\\s*['"]([^'"]+)['"]""", resp.text
    )


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_load_only_local_assets(api: TestClient, page: str) -> None:
    for client in (api, TestClient(_worker_app())):
        urls = [u for u in _assets(client, page) if not u.startswith("data:")]
        assert urls, "the page loads its scripts"
        assert all(u.startswith("/") for u in urls), urls  # no http(s):// (a CDN)
        for url in urls:
            got = client.get(url)
            assert got.status_code == 200 and len(got.content) > 100, url
