"""Mode async (FedBuff) through the coordinator's HTTP API on every backend: at most `concurrency`
clients hold a task, a client trains at most once from each version and is given a new task as soon
as a newer one exists, every B accepted updates make one version from their staleness-weighted
mean (checked against the hand-computed prompt), an update of a closed buffer is counted in the open
one with its staleness, and one staler than max_staleness is refused (410) with nothing stored."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec

from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC, enrol_clients, random_tensors

API = "/api/v1/federations"
SPEC = {**SMALL_SPEC, "mode": "async", "concurrency": 2, "buffer_size": 2, "rounds": 3, "min_clients": 3}


def _task(api: TestClient, fid: int, headers: dict[str, str]) -> dict[str, Any] | None:
    """The client's next task other than an evaluation (reported at once), or None (204)."""
    for _ in range(5):
        r = api.get(f"{API}/{fid}/task?wait=0", headers=headers)
        if r.status_code == 204:
            return None
        task = r.json()
        if task["kind"] != "evaluate":
            return task
        report = {"num_samples": 10, "accuracy": 0.5}
        api.post(f"{API}/{fid}/rounds/{task['version']}/evaluation", json=report, headers=headers)
    raise AssertionError("evaluations without end")


def _upload(
    api: TestClient, fid: int, headers: dict[str, str], task: dict[str, Any], seed: int, n: int
) -> tuple[Any, dict[str, np.ndarray]]:
    tensors = random_tensors(SPEC, seed)
    meta = {"num_samples": str(n), "method": "prompt_tuning", "base_version": str(task["version"])}
    answer = api.put(
        f"{API}/{fid}/rounds/{task['round']}/update", content=wire.encode(tensors, meta), headers=headers
    )
    return answer, tensors


def _version(api: TestClient, fid: int, v: int) -> dict[str, np.ndarray]:
    return wire.decode(api.get(f"{API}/{fid}/prompts/{v}", headers=ADMIN_AUTH).content)[0]


def test_buffers_make_versions_from_staleness_weighted_changes(api: TestClient) -> None:
    spec = FederationSpec.model_validate(SPEC)
    assert spec.buffered and spec.max_staleness == 10 and spec.server_lr == 1.0
    fid, (a, b, c) = enrol_clients(api, SPEC, 3, num_samples=100)
    ta, tb = _task(api, fid, a), _task(api, fid, b)
    assert ta is not None and tb is not None
    assert (ta["round"], ta["version"]) == (tb["round"], tb["version"]) == (1, 0)
    assert _task(api, fid, c) is None  # two of three hold a task: concurrency 2
    assert _task(api, fid, a) == ta  # asking again hands out the same task

    ra, ya = _upload(api, fid, a, ta, 1, 10)
    assert ra.status_code == 201, ra.text
    assert _task(api, fid, a) is None  # it trained from version 0 already; no newer version yet
    tc = _task(api, fid, c)  # a's slot is free
    assert tc is not None and (tc["round"], tc["version"]) == (1, 0)

    rb, yb = _upload(api, fid, b, tb, 2, 30)
    assert rb.status_code == 201
    x0, x1 = _version(api, fid, 0), _version(api, fid, 1)
    # fresh updates (τ = 0): the buffer is FedAvg of its clients' prompts
    want1 = (10 * ya["prompt_embeddings"].astype(np.float64) + 30 * yb["prompt_embeddings"]) / 40
    np.testing.assert_allclose(x1["prompt_embeddings"], want1, rtol=1e-6, atol=1e-6)

    ta2 = _task(api, fid, a)  # a newer version: a is given a task from it at once
    assert ta2 is not None and (ta2["round"], ta2["version"]) == (2, 1)
    rc, yc = _upload(api, fid, c, tc, 3, 20)  # trained from version 0, arrives while buffer 2 is open
    assert rc.status_code == 201 and rc.json()["round"] == 1
    ra2, ya2 = _upload(api, fid, a, ta2, 4, 10)
    assert ra2.status_code == 201
    x2 = _version(api, fid, 2)
    # x2 = x1 + [n_c·s(1)·(y_c − x0) + n_a·s(0)·(y_a − x1)] / (n_c + n_a), s(τ) = 1/√(1+τ)
    e = "prompt_embeddings"
    change = 20 * (yc[e].astype(np.float64) - x0[e]) / np.sqrt(2) + 10 * (ya2[e].astype(np.float64) - x1[e])
    np.testing.assert_allclose(x2[e], x1[e] + change / 30, rtol=1e-5, atol=1e-6)

    rounds = api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json()
    second = next(r for r in rounds if r["round"] == 2)
    assert second["stats"]["buffer"]["staleness"] == {"0": 1, "1": 1}
    assert second["stats"]["buffer"]["updates"] == 2

    # what the operator sees: the status's buffer block, the gauges and the dashboard
    status = api.get(f"{API}/{fid}", headers=ADMIN_AUTH).json()
    buffer = status["buffer"]
    assert (buffer["open_buffer"], buffer["filled"], buffer["buffer_size"], buffer["concurrency"]) == (
        3,
        0,
        2,
        2,
    )
    assert buffer["staleness"] == {"0": 3, "1": 1}
    assert {c["name"]: c["updates"] for c in buffer["clients"]} == {"site-0": 2, "site-1": 1, "site-2": 1}
    assert next(c for c in buffer["clients"] if c["name"] == "site-1")["updates_per_minute"] is None
    metrics = api.get("/metrics").text
    assert f'fedprompt_buffered_updates{{federation="{fid}",staleness="1"}} 1.0' in metrics
    assert f'fedprompt_buffer_updates{{federation="{fid}"}} 0.0' in metrics
    assert api.post("/dashboard/login", data={"token": ADMIN}, follow_redirects=False).status_code == 303
    page = api.get(f"/dashboard/live?federation={fid}").text
    assert "Buffer 3:" in page and "τ=1: 1" in page


def test_an_update_staler_than_max_staleness_is_refused_and_nothing_is_stored(api: TestClient) -> None:
    spec = {**SPEC, "max_staleness": 0, "concurrency": None}
    fid, (a, b, c) = enrol_clients(api, spec, 3)
    ta, tb, tc = (_task(api, fid, h) for h in (a, b, c))
    assert ta and tb and tc
    assert _upload(api, fid, a, ta, 1, 10)[0].status_code == 201
    assert _upload(api, fid, b, tb, 2, 10)[0].status_code == 201  # version 1 written
    before = api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json()
    refused, _ = _upload(api, fid, c, tc, 3, 10)
    assert refused.status_code == 410, refused.text
    assert "max_staleness 0" in refused.json()["detail"]
    assert api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json() == before
    again = _task(api, fid, c)  # the refused client trains again, from the latest version
    assert again is not None and again["version"] == 1


def test_async_refuses_what_it_cannot_honour(api: TestClient) -> None:
    for extra, words in (
        ({"secure_aggregation": {}, "min_clients": 3}, "secure_aggregation"),
        ({"fraction": 0.5}, "concurrency"),
        ({"drift_correction": {"name": "scaffold"}}, "scaffold"),
    ):
        r = api.post(API, json={**SPEC, **extra}, headers=ADMIN_AUTH)
        assert r.status_code == 422 and words in r.text, r.text
    r = api.post(API, json={**SMALL_SPEC, "buffer_size": 3}, headers=ADMIN_AUTH)
    assert r.status_code == 422 and "only with mode 'async'" in r.text


def test_a_robust_rule_sees_the_buffer_rebased_and_a_late_client_starts_from_the_latest(
    api: TestClient,
) -> None:
    spec = {**SPEC, "aggregation": {"name": "median"}, "buffer_size": 3, "concurrency": None, "rounds": 2}
    fid, clients = enrol_clients(api, spec, 3, num_samples=100)
    tasks = [_task(api, fid, h) for h in clients]
    sent = []
    for i, (h, t) in enumerate(zip(clients, tasks, strict=True)):
        assert t is not None and t["version"] == 0
        answer, y = _upload(api, fid, h, t, 10 + i, 10 * (i + 1))
        assert answer.status_code == 201
        sent.append(y["prompt_embeddings"])
    # fresh updates: the coordinate-wise median of the prompts themselves, whatever their weights
    np.testing.assert_allclose(_version(api, fid, 1)["prompt_embeddings"], np.median(sent, axis=0), atol=1e-6)

    token = api.post(f"{API}/{fid}/enrollment-tokens", json={}, headers=ADMIN_AUTH).json()["token"]
    late = api.post(
        f"{API}/{fid}/clients",
        json={"name": "late", "num_samples": 100},
        headers={"Authorization": f"Bearer {token}"},
    )
    first = _task(api, fid, {"Authorization": f"Bearer {late.json()['token']}"})
    assert first is not None and (first["round"], first["version"]) == (2, 1)


def test_a_revoked_clients_task_frees_its_slot_and_its_upload_is_refused(api: TestClient) -> None:
    fid, (a, b, c) = enrol_clients(api, SPEC, 3, num_samples=100)
    ta, tb = _task(api, fid, a), _task(api, fid, b)
    assert ta is not None and tb is not None and _task(api, fid, c) is None  # concurrency 2
    ids = {x["name"]: x["id"] for x in api.get(f"{API}/{fid}/clients", headers=ADMIN_AUTH).json()}
    assert api.delete(f"{API}/{fid}/clients/{ids['site-0']}", headers=ADMIN_AUTH).status_code in (200, 204)
    tc = _task(api, fid, c)
    assert tc is not None and (tc["round"], tc["version"]) == (1, 0)
    assert _upload(api, fid, a, ta, 1, 10)[0].status_code in (401, 403)
    assert api.get(f"{API}/{fid}", headers=ADMIN_AUTH).json()["buffer"]["filled"] == 0
