"""Why a round cannot open, in the operator's terms (issue 34): no Python None, advice that fits."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers import ADMIN_AUTH, SMALL_SPEC


def _federation(api: TestClient, enrol: int, **spec: object) -> int:
    fid = api.post(
        "/api/v1/federations", json={**SMALL_SPEC, "auto_advance": False, **spec}, headers=ADMIN_AUTH
    )
    fid = fid.json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_AUTH).json()[
        "token"
    ]
    for i in range(enrol):
        resp = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": 10},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert resp.status_code == 201, resp.text
    return fid


def _open(api: TestClient, fid: int) -> str:
    resp = api.post(f"/api/v1/federations/{fid}/rounds", headers=ADMIN_AUTH)
    assert resp.status_code == 409, resp.text
    return resp.json()["detail"]


def test_too_few_enrolled_says_how_many_more_to_enrol(api: TestClient) -> None:
    detail = _open(api, _federation(api, 1))
    assert detail == (
        "cannot open round 1: it needs 2 available client(s) (min_clients); 1 enrolled, 1 available; "
        "enrol 1 more worker(s)"
    )
    assert "None" not in _open(api, _federation(api, 2, expected_clients=3))


def test_enrolled_but_offline_clients_are_told_to_start_not_to_enrol(api: TestClient) -> None:
    fid = _federation(api, 2)
    service = api.app.state.service
    real = service.clock
    service.clock = lambda: real() + 10_000  # past availability_timeout_s: nobody has polled since
    try:
        detail = _open(api, fid)
    finally:
        service.clock = real
    assert "2 enrolled, 0 available; start the enrolled workers" in detail
    assert "enrol" not in detail.split("; ", 2)[-1].replace("enrolled", "")
