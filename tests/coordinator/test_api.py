"""The REST API: auth, problem+json errors, and bad input that leaves the database unchanged."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.persistence.db import Base
from fedprompt.shared import wire
from sqlalchemy import func, select

from tests.coordinator.conftest import LIMIT
from tests.helpers import ADMIN, SMALL_SPEC, random_tensors, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def snapshot(api: TestClient) -> dict[str, Any]:
    """Row counts of every table and a digest of every row's content."""
    sessions = api.app.state.service.sessions
    out: dict[str, Any] = {}
    with sessions() as s:
        for table in Base.metadata.sorted_tables:
            rows = s.execute(select(table).order_by(*table.primary_key.columns)).all()
            out[table.name] = (
                s.scalar(select(func.count()).select_from(table)),
                hashlib.sha256(repr([tuple(r) for r in rows]).encode()).hexdigest(),
            )
    return out


def is_problem(resp, status: int) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == status and body["title"] and len(body["detail"]) > 10
    return body


@pytest.fixture
def world(api: TestClient) -> dict[str, Any]:
    """A federation with 3 enrolled clients (C=0.5 → 2 selected) and round 1 open."""
    spec = {**SMALL_SPEC, "fraction": 0.5, "expected_clients": 3}
    fid = api.post("/api/v1/federations", json=spec, headers=ADMIN_H).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_H).json()["token"]
    clients = []
    for i in range(3):
        r = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": 10 + i},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 201, r.text
        clients.append(r.json())
    rnd = api.get(f"/api/v1/federations/{fid}/rounds/1", headers=ADMIN_H).json()
    selected = {p["client_id"] for p in rnd["participants"]}
    by_id = {c["client_id"]: {"Authorization": f"Bearer {c['token']}"} for c in clients}
    sel = [by_id[c] for c in sorted(selected)]
    outsider = next(h for cid, h in by_id.items() if cid not in selected)
    return {"fid": fid, "spec": spec, "selected": sel, "outsider": outsider, "clients": clients}


def _body(spec: dict[str, Any], tensors: dict[str, np.ndarray], **meta: Any) -> bytes:
    return wire.encode(tensors, {"num_samples": "10", **meta})


def bad_bodies(spec: dict[str, Any]) -> dict[str, bytes]:
    good = random_tensors(spec, 0)
    valid = _body(spec, good)
    name = next(iter(good))
    return {
        "truncated safetensors": valid[: len(valid) // 2],
        "not safetensors": b'{"prompt": [1, 2, 3]}' + b"\x00" * 40,
        "empty body": b"",
        "wrong tensor name": _body(spec, {"prompt": good[name]}),
        "extra tensor": _body(spec, {**good, "extra": np.zeros((2,), np.float32)}),
        "wrong shape": _body(spec, {name: good[name][:, :-1]}),
        "float64": _st_raw({name: good[name].astype(np.float64)}),
        "int dtype": _st_raw({name: good[name].astype(np.int32)}),
        "nan": _body(
            spec, {name: np.where(np.eye(*good[name].shape) > 0, np.nan, good[name]).astype(np.float32)}
        ),
        "inf": _body(spec, {name: np.full(good[name].shape, np.inf, np.float32)}),
        "missing num_samples": wire.encode(good, {}),
        "zero num_samples": wire.encode(good, {"num_samples": "0"}),
        "other method": _body(spec, good, method="prefix_tuning"),
        "bad metrics": _body(spec, good, metrics="not json"),
    }


def _st_raw(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": wire.FORMAT, "num_samples": "10"})


@pytest.mark.parametrize("case", list(bad_bodies(SMALL_SPEC)))
def test_bad_upload_body_is_refused_and_changes_nothing(
    api: TestClient, world: dict[str, Any], case: str
) -> None:
    before = snapshot(api)
    body = bad_bodies(world["spec"])[case]
    resp = api.put(
        f"/api/v1/federations/{world['fid']}/rounds/1/update", content=body, headers=world["selected"][0]
    )
    problem = is_problem(resp, 422)
    assert (
        "safetensors" in problem["detail"]
        or "tensor" in problem["detail"]
        or "metadata" in problem["detail"]
        or "method" in problem["detail"]
    )
    assert snapshot(api) == before


def test_body_over_limit_is_413_and_changes_nothing(api: TestClient, world: dict[str, Any]) -> None:
    before = snapshot(api)
    resp = api.put(
        f"/api/v1/federations/{world['fid']}/rounds/1/update",
        content=b"x" * (LIMIT + 1),
        headers=world["selected"][0],
    )
    assert "limit" in is_problem(resp, 413)["detail"]
    assert snapshot(api) == before


def test_valid_upload_is_committed_and_identical_retry_is_200(api: TestClient, world: dict[str, Any]) -> None:
    url = f"/api/v1/federations/{world['fid']}/rounds/1/update"
    blob = update_blob(world["spec"], 5, base_version=0)
    first = api.put(url, content=blob, headers=world["selected"][0])
    assert first.status_code == 201, first.text
    after_first = snapshot(api)
    again = api.put(url, content=blob, headers=world["selected"][0])
    assert again.status_code == 200 and again.json() == first.json()
    assert snapshot(api) == after_first
    conflict = api.put(url, content=update_blob(world["spec"], 6), headers=world["selected"][0])
    is_problem(conflict, 409)
    assert snapshot(api) == after_first


@pytest.mark.parametrize(
    "case, status",
    [
        ("wrong round", 404),
        ("closed round", 410),
        ("not selected", 403),
        ("unknown client token", 401),
        ("revoked client token", 403),
        ("missing client token", 401),
        ("admin token on client route", 401),
    ],
)
def test_refused_uploads_change_nothing(
    api: TestClient, world: dict[str, Any], case: str, status: int
) -> None:
    fid, spec = world["fid"], world["spec"]
    headers, number = world["selected"][0], 1
    if case == "closed round":
        for h in world["selected"]:
            assert (
                api.put(
                    f"/api/v1/federations/{fid}/rounds/1/update", content=update_blob(spec, 9), headers=h
                ).status_code
                == 201
            )
        api.app.state.service.cycle.after_upload(fid)
        assert api.get(f"/api/v1/federations/{fid}/rounds/1", headers=ADMIN_H).json()["state"] == "closed"
        headers = world["outsider"]  # not a participant of round 1 and has not uploaded
    elif case == "wrong round":
        number = 5
    elif case == "not selected":
        headers = world["outsider"]
    elif case == "unknown client token":
        headers = {"Authorization": "Bearer fpc_unknown"}
    elif case == "revoked client token":
        cid = world["clients"][0]["client_id"]
        assert api.delete(f"/api/v1/federations/{fid}/clients/{cid}", headers=ADMIN_H).status_code == 204
        headers = {"Authorization": f"Bearer {world['clients'][0]['token']}"}
    elif case == "missing client token":
        headers = {}
    elif case == "admin token on client route":
        headers = ADMIN_H
    before = snapshot(api)
    resp = api.put(
        f"/api/v1/federations/{fid}/rounds/{number}/update", content=update_blob(spec, 11), headers=headers
    )
    is_problem(resp, status)
    assert snapshot(api) == before


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/api/v1/federations"),
        ("POST", "/api/v1/federations/{fid}/rounds"),
        ("POST", "/api/v1/federations/{fid}/enrollment-tokens"),
        ("GET", "/api/v1/federations/{fid}/clients"),
        ("GET", "/api/v1/federations/{fid}/rounds"),
    ],
)
def test_admin_routes_refuse_client_tokens(
    api: TestClient, world: dict[str, Any], method: str, path: str
) -> None:
    before = snapshot(api)
    resp = api.request(method, path.format(fid=world["fid"]), headers=world["selected"][0], json={})
    assert "admin token" in is_problem(resp, 403)["detail"]
    is_problem(api.request(method, path.format(fid=world["fid"])), 401)
    assert snapshot(api) == before


def test_enrolment_with_expired_or_used_up_token(api: TestClient, world: dict[str, Any]) -> None:
    fid = world["fid"]
    once = api.post(
        f"/api/v1/federations/{fid}/enrollment-tokens", json={"max_uses": 1}, headers=ADMIN_H
    ).json()["token"]
    enrol = {"name": "late", "num_samples": 3}
    assert (
        api.post(
            f"/api/v1/federations/{fid}/clients", json=enrol, headers={"Authorization": f"Bearer {once}"}
        ).status_code
        == 201
    )
    before = snapshot(api)
    used = api.post(
        f"/api/v1/federations/{fid}/clients", json=enrol, headers={"Authorization": f"Bearer {once}"}
    )
    assert "used up" in is_problem(used, 401)["detail"]
    expiring = api.post(
        f"/api/v1/federations/{fid}/enrollment-tokens", json={"expires_in_s": 1}, headers=ADMIN_H
    ).json()["token"]
    service = api.app.state.service
    real_clock = service.clock
    service.clock = lambda: real_clock() + 5
    try:
        before = snapshot(api)
        expired = api.post(
            f"/api/v1/federations/{fid}/clients", json=enrol, headers={"Authorization": f"Bearer {expiring}"}
        )
        assert "expired" in is_problem(expired, 401)["detail"]
        assert snapshot(api) == before
    finally:
        service.clock = real_clock


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"fraction": 0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"quorum": 5, "min_clients": 2}, "quorum"),
        ({"rounds": 0}, "rounds"),
        ({"template": "no mask here"}, "MASK"),
        ({"verbalizer": [["good"]]}, "verbalizer"),
        ({"aggregation": {"name": "nope"}}, "aggregation"),
        ({"unknown_field": 1}, "unknown_field"),
        ({"lr": -1}, "lr"),
    ],
)
def test_malformed_spec_is_422_and_creates_nothing(
    api: TestClient, patch: dict[str, Any], needle: str
) -> None:
    before = snapshot(api)
    resp = api.post("/api/v1/federations", json={**SMALL_SPEC, **patch}, headers=ADMIN_H)
    assert needle in is_problem(resp, 422)["detail"]
    assert snapshot(api) == before


def test_non_json_spec_is_problem(api: TestClient) -> None:
    resp = api.post(
        "/api/v1/federations", content=b"{not json", headers={**ADMIN_H, "content-type": "application/json"}
    )
    is_problem(resp, 422)


def test_unknown_federation_and_route_are_problems(api: TestClient) -> None:
    assert "does not exist" in is_problem(api.get("/api/v1/federations/999", headers=ADMIN_H), 404)["detail"]
    is_problem(api.get("/api/v1/nothing-here"), 404)


def test_prompt_download_has_etag_and_verifies(api: TestClient, world: dict[str, Any]) -> None:
    resp = api.get(f"/api/v1/federations/{world['fid']}/prompts/latest", headers=world["selected"][0])
    assert resp.status_code == 200
    assert resp.headers["etag"] == f'"{wire.sha256(resp.content)}"'
    tensors, _ = wire.decode_checked(resp.content, {"prompt_embeddings": (4, 8)})
    again = api.get(
        f"/api/v1/federations/{world['fid']}/prompts/0",
        headers={**ADMIN_H, "If-None-Match": resp.headers["etag"]},
    )
    assert again.status_code == 304


def test_long_poll_returns_204_with_retry_after(api: TestClient, world: dict[str, Any]) -> None:
    fid, h = world["fid"], world["outsider"]
    first = api.get(f"/api/v1/federations/{fid}/task", headers=h)
    assert first.json()["kind"] == "evaluate"
    api.post(
        f"/api/v1/federations/{fid}/rounds/0/evaluation", json={"num_samples": 5, "accuracy": 0.5}, headers=h
    )
    idle = api.get(f"/api/v1/federations/{fid}/task?wait=0.3", headers=h)
    assert idle.status_code == 204 and idle.headers["retry-after"] == "1"


def test_readyz_and_openapi(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json() == {"status": "ready"}
    paths = api.get("/openapi.json").json()["paths"]
    assert "/api/v1/federations/{fid}/rounds/{number}/update" in paths


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/api/v1/federations/99999999999999999999", None),
        ("GET", "/api/v1/federations/{fid}/rounds/3000000000", None),
        ("GET", "/api/v1/federations/{fid}/prompts/99999999999999999999", None),
        ("GET", "/api/v1/federations/{fid}/events?after=99999999999999999999", None),
        ("POST", "/api/v1/federations/{fid}/enrollment-tokens", {"max_uses": 10**20}),
        ("POST", "/api/v1/federations/{fid}/enrollment-tokens", {"expires_in_s": 1e308}),
        ("POST", "/api/v1/federations", {**SMALL_SPEC, "num_virtual_tokens": 1024, "hidden_size": 65536}),
        ("POST", "/api/v1/federations", {**SMALL_SPEC, "min_clients": 10**12}),
    ],
)
def test_out_of_range_input_is_a_4xx_problem_never_a_500(
    api: TestClient, world: dict[str, Any], method: str, path: str, body: dict[str, Any] | None
) -> None:
    before = snapshot(api)
    resp = api.request(method, path.format(fid=world["fid"]), json=body, headers=ADMIN_H)
    assert 400 <= resp.status_code < 500, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert snapshot(api) == before
