"""A federation with a server optimiser, through the service on every backend: the prompt versions it
produces from known uploads, its state kept in the database across coordinator instances, and the
default (no optimiser) path unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from fedprompt.coordinator.persistence.db import ServerOptimizerState, make_sessionmaker
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec
from sqlalchemy import select

from tests.helpers import ADMIN_AUTH, SMALL_SPEC, update_blob

ADAM = {"name": "fedadam", "lr": 0.05, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}


def _federation(service: Coordinator, **overrides: Any) -> tuple[int, FederationSpec]:
    spec = FederationSpec.model_validate({**SMALL_SPEC, **overrides})
    return service.federations.create_federation(spec).id, spec


def _enrol(service: Coordinator, fid: int, n: int) -> list[Any]:
    token, _ = service.enrolment.create_enrollment_token(fid)
    # 30 samples each: no upload below weighs more than its client enrolled with
    return [service.enrolment.enroll(fid, token, name=f"c{i}", num_samples=30, info={})[0] for i in range(n)]


def _prompt(service: Coordinator, fid: int, version: int) -> np.ndarray:
    return wire.decode(service.tasks.get_prompt(fid, version).blob)[0]["prompt_embeddings"]


def _round(
    service: Coordinator,
    fid: int,
    spec: FederationSpec,
    clients: list[Any],
    number: int,
    seeds: tuple[int, int],
) -> np.ndarray:
    """Clients upload seeded prompts with 10 and 30 samples; returns their FedAvg as the service forms it."""
    blobs = [
        update_blob(spec, seed, num_samples=n, base_version=number - 1)
        for seed, n in zip(seeds, (10, 30), strict=True)
    ]
    for client, blob in zip(clients, blobs, strict=True):
        assert service.uploads.upload(fid, number, client, blob).created
    service.cycle.after_upload(fid)
    a, b = (wire.decode(blob)[0]["prompt_embeddings"].astype(np.float64) for blob in blobs)
    return (a * 0.25 + b * 0.75).astype(np.float32)


def _states(service: Coordinator, fid: int) -> list[tuple[int, str]]:
    with service.sessions() as s:
        rows = s.execute(
            select(ServerOptimizerState.version, ServerOptimizerState.optimizer).where(
                ServerOptimizerState.federation_id == fid
            )
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def test_fedadam_versions_from_known_uploads_and_state_survives_a_new_coordinator(
    service: Coordinator,
    engine,
    clock,  # type: ignore[no-untyped-def]
) -> None:
    fid, spec = _federation(service, server_optimizer=ADAM)
    clients = _enrol(service, fid, 2)
    x0 = _prompt(service, fid, 0).astype(np.float64)

    # Round 1 on the first coordinator. FedAdam (Flower's rule, written out here):
    # Δ = avg - x, m = 0.9 m + 0.1 Δ, v = 0.99 v + 0.01 Δ², x += η_t m / (√v + 1e-3),
    # η_t = 0.05 √(1 - 0.99^(t+1)) / (1 - 0.9^(t+1)).
    avg1 = _round(service, fid, spec, clients, 1, (1, 2)).astype(np.float64)
    d1 = avg1 - x0
    m1, v1 = 0.1 * d1, 0.01 * d1 * d1
    eta1 = 0.05 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    x1 = _prompt(service, fid, 1)
    np.testing.assert_allclose(x1, (x0 + eta1 * m1 / (np.sqrt(v1) + 1e-3)).astype(np.float32), rtol=1e-6)
    assert not np.allclose(x1, avg1, atol=1e-4)  # not the plain average
    assert _states(service, fid) == [(1, "fedadam")]
    stats = service.reads.round_detail(fid, 1)["stats"]["server_optimizer"]
    assert stats["name"] == "fedadam" and stats["step"] == 1 and stats["lr"] == 0.05
    assert stats["pseudo_gradient_norm"] > stats["update_norm"] > 0

    # Round 2 on a new coordinator over the same database: the state comes from the database.
    fresh = Coordinator(make_sessionmaker(engine), clock=clock)
    avg2 = _round(fresh, fid, spec, clients, 2, (3, 4)).astype(np.float64)
    d2 = avg2 - x1.astype(np.float64)
    m2, v2 = 0.9 * m1 + 0.1 * d2, 0.99 * v1 + 0.01 * d2 * d2
    eta2 = 0.05 * np.sqrt(1 - 0.99**3) / (1 - 0.9**3)
    expected = (x1.astype(np.float64) + eta2 * m2 / (np.sqrt(v2) + 1e-3)).astype(np.float32)
    x2 = _prompt(fresh, fid, 2)
    np.testing.assert_allclose(x2, expected, rtol=1e-6)
    # starting afresh (empty state) would give another prompt: the carried state is what made this one
    m_new, v_new = 0.1 * d2, 0.01 * d2 * d2
    restarted = (x1 + eta1 * m_new / (np.sqrt(v_new) + 1e-3)).astype(np.float32)
    assert not np.allclose(x2, restarted, rtol=1e-3)
    assert _states(fresh, fid) == [(2, "fedadam")]  # only the latest state is kept
    assert fresh.reads.round_detail(fid, 2)["stats"]["server_optimizer"]["step"] == 2


def test_without_a_server_optimiser_the_version_is_the_weighted_mean_and_no_state_is_kept(
    service: Coordinator,
) -> None:
    for optimizer in (None, {"name": "fedavg"}):
        fid, spec = _federation(service, server_optimizer=optimizer)
        clients = _enrol(service, fid, 2)
        avg = _round(service, fid, spec, clients, 1, (1, 2))
        np.testing.assert_array_equal(_prompt(service, fid, 1), avg)
        assert _states(service, fid) == []
        assert "server_optimizer" not in service.reads.round_detail(fid, 1)["stats"]


def test_fedavgm_with_a_robust_rule_keeps_the_rules_notes(service: Coordinator) -> None:
    fid, spec = _federation(
        service,
        aggregation={"name": "norm_bound", "params": {"bound": 0.5}},
        server_optimizer={"name": "fedavgm", "lr": 2.0, "momentum": 0.5},
    )
    clients = _enrol(service, fid, 2)
    x0 = _prompt(service, fid, 0).astype(np.float64)
    _round(service, fid, spec, clients, 1, (1, 2))
    stats = service.reads.round_detail(fid, 1)["stats"]
    assert all("clipped" in note for note in stats["notes"].values())
    # first step: m = Δ, x1 = x0 + 2 Δ, so the update is twice the clipped aggregate's distance
    x1 = _prompt(service, fid, 1).astype(np.float64)
    record = stats["server_optimizer"]
    assert np.isclose(record["update_norm"], 2 * record["pseudo_gradient_norm"], rtol=1e-5)
    assert np.isclose(np.linalg.norm(x1 - x0), record["update_norm"], rtol=1e-5)


def test_the_api_fills_in_defaults_and_refuses_bad_server_optimisers(api: TestClient) -> None:
    created = api.post(
        "/api/v1/federations",
        json={**SMALL_SPEC, "server_optimizer": {"name": "fedyogi"}},
        headers=ADMIN_AUTH,
    )
    assert created.status_code == 201, created.text
    spec = api.get(f"/api/v1/federations/{created.json()['id']}/spec", headers=ADMIN_AUTH).json()
    assert spec["server_optimizer"] == {
        "name": "fedyogi",
        "lr": 0.01,
        "momentum": None,
        "beta1": 0.9,
        "beta2": 0.99,
        "tau": 1e-3,
    }
    for bad, needle in (
        ({"name": "fedadam", "momentum": 0.9}, "beta1"),
        ({"name": "adam"}, "server_optimizer.name"),
        ({"name": "fedavgm", "momentum": 1.0}, "server_optimizer.momentum"),
    ):
        resp = api.post(
            "/api/v1/federations", json={**SMALL_SPEC, "server_optimizer": bad}, headers=ADMIN_AUTH
        )
        assert resp.status_code == 422 and resp.headers["content-type"].startswith("application/problem+json")
        assert needle in resp.json()["detail"]
