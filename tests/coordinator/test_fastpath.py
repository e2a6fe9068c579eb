"""The fast paths of the workers' four routes (task poll, prompt download, evaluation report, upload;
coordinator/api/fastpath.py) answer every request as FastAPI's own handler of the same route does,
and take the plain ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
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

from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC, federation_with_clients, update_blob


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
        # a client with no evaluation examples in a federation still waiting for a third: nothing to do
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
        yield {
            "api": api,
            "fid": fid,
            "client": clients[0]["token"],
            "second": clients[1]["token"],
            "stranger": strangers[0]["token"],
            "idle": idle,
            "other": other,
            "routes": routes,
        }


def _requests(w: dict[str, Any]) -> list[tuple[str, str, dict[str, str], bytes | None, bool]]:
    """(method, path, headers, body, plain: the fast path answers it, or raises its refusal); none
    changes the world (stored reports and uploads are tests of their own below)."""
    fid, me, admin = w["fid"], {"Authorization": f"Bearer {w['client']}"}, ADMIN_AUTH
    stranger, wrong = {"Authorization": f"Bearer {w['stranger']}"}, {"Authorization": "Bearer fpc_nope"}
    idle = {"Authorization": f"Bearer {w['idle']}"}
    base, report = f"/api/v1/federations/{fid}", f"/api/v1/federations/{fid}/rounds/0/evaluation"
    good = json.dumps({"num_samples": 5, "accuracy": 0.5}).encode()
    as_json = {"Content-Type": "application/json"}
    update, blob = f"{base}/rounds/1/update", update_blob({**SMALL_SPEC, "min_clients": 2}, 1, base_version=0)
    return [
        ("GET", f"{base}/task", me, None, True),
        ("GET", f"{base}/task?wait=0", me, None, True),
        ("GET", f"{base}/task?wait=0.05", me, None, True),
        ("GET", f"{base}/task", {}, None, True),
        ("GET", f"{base}/task", wrong, None, True),
        ("GET", f"{base}/task", stranger, None, True),
        ("GET", f"{base}/task", admin, None, True),
        ("GET", f"/api/v1/federations/{w['other']}/task", me, None, True),
        ("GET", f"/api/v1/federations/{w['other']}/task?wait=0.05", idle, None, True),
        ("GET", f"/api/v1/federations/{2**31}/task", me, None, False),
        ("GET", "/api/v1/federations/01x/task", me, None, False),
        ("GET", f"{base}/task?wait=301", me, None, False),
        ("GET", f"{base}/task?wait=-1", me, None, False),
        ("GET", f"{base}/task?wait=1e1", me, None, False),
        ("GET", f"{base}/task?wait=abc", {}, None, False),
        ("GET", f"{base}/task?wait=0&wait=1", me, None, False),
        ("GET", f"{base}/prompts/0", me, None, True),
        ("GET", f"{base}/prompts/latest", me, None, True),
        ("GET", f"{base}/prompts/best", admin, None, True),
        ("GET", f"{base}/prompts/0", admin, None, True),
        ("GET", f"{base}/prompts/7", me, None, True),
        ("GET", f"{base}/prompts/0", stranger, None, True),
        ("GET", f"{base}/prompts/0", {}, None, True),
        ("GET", f"{base}/prompts/0", wrong, None, True),
        ("GET", f"{base}/prompts/{2**31}", me, None, False),
        ("GET", f"{base}/prompts/first", me, None, False),
        ("GET", f"{base}/prompts/-1", admin, None, False),
        ("POST", report, {**wrong, **as_json}, good, True),
        ("POST", report, {**stranger, **as_json}, good, True),
        ("POST", report, as_json, good, True),
        (
            "POST",
            report,
            {**me, **as_json},
            json.dumps({"num_samples": 5, "accuracy": 0.5, "version": 9}).encode(),
            True,
        ),
        ("POST", report, {**me, **as_json}, b'{"num_samples": 0, "accuracy": 2}', False),
        ("POST", report, {**me, **as_json}, b'{"num_samples": "5", "accuracy": 0.5}', False),
        ("POST", report, {**me, **as_json}, b'{"num_samples": 5, "accuracy": 0.5, "extra": 1}', False),
        ("POST", report, {**wrong, **as_json}, b"{not json", False),
        ("POST", report, {**me, **as_json}, b"[" * 100 + b"]" * 100, True),  # jsonlimits: 400, raised
        ("POST", report, {**me, **as_json}, b"", False),
        ("POST", report, {**me, "Content-Type": "text/plain"}, good, False),
        ("POST", report, me, good, False),
        ("POST", report.replace("/0/", "/x/"), {**me, **as_json}, good, False),
        ("PUT", update, wrong, blob, True),
        ("PUT", update, stranger, blob, True),
        ("PUT", update, {}, blob, True),
        ("PUT", update, me, b"not safetensors", True),
        ("PUT", update.replace("/1/", "/7/"), me, blob, True),
        ("PUT", update.replace("/1/", "/01.0/"), me, blob, False),
        ("PUT", update.replace(f"/{fid}/", f"/{2**31}/"), me, blob, False),
    ]


def _answer(
    api: TestClient, method: str, path: str, headers: dict[str, str], body: bytes | None
) -> tuple[int, bytes, dict[str, str]]:
    r = api.request(method, path, headers=headers, content=body)
    kept = {k: v for k, v in r.headers.items() if k.lower() not in ("x-request-id", "date", "content-length")}
    return r.status_code, r.content, kept


@contextmanager
def _fast_paths(routes: list[BoundedJSONRoute], taken: list[bool] | None) -> Iterator[None]:
    """The routes' fast paths spied on (`taken`: True for each answer, False for each hand-over to
    FastAPI), or switched off (None); restored after (the routes are module-level)."""
    kept = [(r, r.fast_path) for r in routes]
    try:
        for route, fn in kept:

            async def spy(request: Any, fn: Any = fn) -> Any:
                answer = await fn(request)
                assert taken is not None
                taken.append(answer is not None)
                return answer

            route.fast_path = None if taken is None else spy
        yield
    finally:
        for route, fn in kept:
            route.fast_path = fn


def test_the_fast_paths_answer_as_fastapi_does_and_take_the_plain_requests(world: dict[str, Any]) -> None:
    api, routes = world["api"], world["routes"]
    assert sorted(r.path for r in routes) == [
        "/api/v1/federations/{fid}/prompts/{version}",
        "/api/v1/federations/{fid}/rounds/{number}/evaluation",
        "/api/v1/federations/{fid}/rounds/{number}/update",
        "/api/v1/federations/{fid}/task",
    ]
    requests, taken = _requests(world), []
    with _fast_paths(routes, taken):
        with_fast = [_answer(api, *r[:4]) for r in requests]
    with _fast_paths(routes, None):
        without = [_answer(api, *r[:4]) for r in requests]
    for request, a, b in zip(requests, with_fast, without, strict=True):
        assert a == b, (request, a, b)
    assert {s for s, _, _ in with_fast} >= {200, 204, 400, 401, 403, 404, 422}
    # a plain request the fast path refuses raises (the same problem FastAPI's handler answers), so
    # `taken` holds True for each plain one answered and False for each other one handed on
    plain = sum(1 for *_, is_plain in requests if is_plain)
    answered = sum(1 for r, (s, _, _) in zip(requests, with_fast, strict=True) if r[-1] and s < 400)
    assert taken.count(True) == answered and 0 < answered < plain
    assert taken.count(False) == sum(1 for *_, is_plain in requests if not is_plain)


def test_a_report_is_stored_alike_either_way(world: dict[str, Any]) -> None:
    api, fid = world["api"], world["fid"]
    body = json.dumps({"num_samples": 5, "accuracy": 0.5, "metrics": {"macro_f1": 0.4}}).encode()
    path = f"/api/v1/federations/{fid}/rounds/0/evaluation"
    answers = []
    for token, taken in ((world["client"], []), (world["second"], None)):
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with _fast_paths(world["routes"], taken):
            answers.append([_answer(api, "POST", path, headers, body) for _ in range(2)])
        assert taken is None or taken == [True, True]
    assert answers[0] == answers[1]
    assert [(s, json.loads(b)) for s, b, _ in answers[0]] == [
        (201, {"version": 0, "stored": True}),
        (200, {"version": 0, "stored": False}),
    ]
    sites = api.get(f"/api/v1/federations/{fid}/evaluations/0/sites", headers=ADMIN_AUTH).json()
    assert sorted(site["num_samples"] for site in sites["sites"]) == [5, 5]


def test_uploads_are_stored_alike_either_way_and_the_last_one_closes_the_round(world: dict[str, Any]) -> None:
    api, fid = world["api"], world["fid"]
    path = f"/api/v1/federations/{fid}/rounds/1/update"
    answers = []
    for seed, (token, taken) in enumerate(((world["client"], None), (world["second"], [])), start=1):
        blob = update_blob({**SMALL_SPEC, "min_clients": 2}, seed, base_version=0)
        with _fast_paths(world["routes"], taken):
            answers.append(
                [_answer(api, "PUT", path, {"Authorization": f"Bearer {token}"}, blob) for _ in range(2)]
            )
        assert taken is None or taken == [True, True]
    for first, again in answers:  # accepted, then the identical re-upload
        assert (first[0], again[0]) == (201, 200)
        receipt = json.loads(first[1])
        assert json.loads(again[1]) == receipt and receipt["round"] == 1
    assert json.loads(answers[0][0][1]).keys() == json.loads(answers[1][0][1]).keys()
    # the second upload (the fast path's) completed round 1: aggregated after its answer, round 2 open
    rounds = api.get(f"/api/v1/federations/{fid}/rounds", headers=ADMIN_AUTH).json()
    assert [(r["round"], r["state"], r["result_version"]) for r in rounds][:2] == [
        (1, "closed", 1),
        (2, "open", None),
    ]
