"""The fast paths of the task poll and the prompt download (coordinator/api/fastpath.py) answer
every request as FastAPI's own handler of the same route does, and take the plain ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.api.fastpath import plain_id
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.routes import federations, rounds
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.migrate import upgrade

from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC, federation_with_clients


def test_plain_ids_are_ascii_digits_within_the_id_range() -> None:
    assert plain_id("0") == 0 and plain_id("12") == 12 and plain_id(str(2**31 - 1)) == 2**31 - 1
    for text in ("", "-1", "+1", "1.0", "1_0", " 1", "²", "١", str(2**31), "12345678901"):
        assert plain_id(text) is None, text


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'fast.db'}"
    upgrade(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path), sweep=False)
    with TestClient(app) as api:
        fid, _, clients = federation_with_clients(api, 2, spec={**SMALL_SPEC, "min_clients": 2})
        other, enrol, strangers = federation_with_clients(
            api, 1, spec={**SMALL_SPEC, "name": "other", "min_clients": 3}
        )
        # a client with no evaluation examples in a federation still waiting for its second: nothing to do
        idle = api.post(
            f"/api/v1/federations/{other}/clients",
            json={"name": "idle", "num_samples": 5, "info": {"num_eval": 0}},
            headers={"Authorization": f"Bearer {enrol}"},
        ).json()["token"]
        routes = [
            r
            for module in (federations, rounds)
            for r in module.router.routes
            if isinstance(r, BoundedJSONRoute) and r.fast_path is not None
        ]
        yield {"api": api, "fid": fid, "client": clients[0]["token"], "stranger": strangers[0]["token"], "idle": idle,
               "other": other, "routes": routes}  # fmt: skip


def _requests(w: dict[str, Any]) -> list[tuple[str, dict[str, str], bool]]:
    """(path, headers, plain: the fast path answers it)."""
    fid, me, admin = w["fid"], {"Authorization": f"Bearer {w['client']}"}, ADMIN_AUTH
    stranger, wrong = {"Authorization": f"Bearer {w['stranger']}"}, {"Authorization": "Bearer fpc_nope"}
    base = f"/api/v1/federations/{fid}"
    return [
        (f"{base}/task", me, True),
        (f"{base}/task?wait=0", me, True),
        (f"{base}/task?wait=0.05", me, True),
        (f"{base}/task", {}, True),
        (f"{base}/task", wrong, True),
        (f"{base}/task", stranger, True),
        (f"{base}/task", admin, True),
        (f"/api/v1/federations/{w['other']}/task", me, True),
        (f"/api/v1/federations/{w['other']}/task?wait=0.05", {"Authorization": f"Bearer {w['idle']}"}, True),
        (f"/api/v1/federations/{2**31}/task", me, False),
        ("/api/v1/federations/01x/task", me, False),
        (f"{base}/task?wait=301", me, False),
        (f"{base}/task?wait=-1", me, False),
        (f"{base}/task?wait=1e1", me, False),
        (f"{base}/task?wait=abc", {}, False),
        (f"{base}/task?wait=0&wait=1", me, False),
        (f"{base}/prompts/0", me, True),
        (f"{base}/prompts/latest", me, True),
        (f"{base}/prompts/best", admin, True),
        (f"{base}/prompts/0", admin, True),
        (f"{base}/prompts/7", me, True),
        (f"{base}/prompts/0", stranger, True),
        (f"{base}/prompts/0", {}, True),
        (f"{base}/prompts/0", wrong, True),
        (f"{base}/prompts/{2**31}", me, False),
        (f"{base}/prompts/first", me, False),
        (f"{base}/prompts/-1", admin, False),
    ]


def _answer(api: TestClient, path: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    r = api.get(path, headers=headers)
    kept = {k: v for k, v in r.headers.items() if k.lower() not in ("x-request-id", "date", "content-length")}
    return r.status_code, r.content, kept


def test_the_fast_paths_answer_as_fastapi_does_and_take_the_plain_requests(world: dict[str, Any]) -> None:
    api, routes = world["api"], world["routes"]
    assert sorted(r.path for r in routes) == [
        "/api/v1/federations/{fid}/prompts/{version}",
        "/api/v1/federations/{fid}/task",
    ]
    taken: list[bool] = []
    fast = [(r, r.fast_path) for r in routes]  # module-level routes: restored below
    try:
        for route, fn in fast:

            async def spy(request: Any, fn: Any = fn) -> Any:
                answer = await fn(request)
                taken.append(answer is not None)
                return answer

            route.fast_path = spy
        requests = _requests(world)
        with_fast = [_answer(api, p, h) for p, h, _ in requests]
        for route, _ in fast:
            route.fast_path = None
        without = [_answer(api, p, h) for p, h, _ in requests]
    finally:
        for route, fn in fast:
            route.fast_path = fn
    for (path, headers, _), a, b in zip(requests, with_fast, without, strict=True):
        assert a == b, (path, headers, a, b)
    assert {s for s, _, _ in with_fast} >= {200, 204, 401, 403, 404, 422}
    # a plain request the fast path refuses raises (the same problem FastAPI's handler answers), so
    # `taken` holds True for each plain one answered and False for each other one handed on
    plain = [status for (_, _, is_plain), (status, _, _) in zip(requests, with_fast, strict=True) if is_plain]
    assert taken.count(True) == sum(1 for status in plain if status < 400)
    assert taken.count(False) == sum(1 for *_, is_plain in requests if not is_plain)
