"""Secure rounds through the API (in process; the aggregate on both backends): the aggregate equals FedAvg of the
clients' updates within the quantisation bound, dropouts at every stage, fewer than t survivors fail
the round and it is retried with a fresh selection, replayed and altered masked uploads are refused,
and nothing stored is a client's update."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.logic import secagg as rules
from fedprompt.coordinator.persistence.db import (
    Round,
    SecaggMessage,
    SecaggRound,
    Update,
    make_engine,
    make_sessionmaker,
)
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.coordinator.usecases import secagg_messages as msgs
from fedprompt.shared import wire
from fedprompt.shared.secagg import masks, protocol, quantise, shamir
from fedprompt.shared.spec import FederationSpec, initial_prompt
from sqlalchemy import select

from tests.coordinator.conftest import FakeClock
from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC
from tests.secagg_clients import ScriptedClient, close_to_any

N = 10
SA = {"clip": 1.0, "bits": 20, "threshold": 0.5, "stage_deadline_s": 30}
SPEC: dict[str, Any] = {
    **SMALL_SPEC,
    "min_clients": 5,
    "fraction": 1.0,
    "expected_clients": N,
    "rounds": 2,
    "round_deadline_s": 60,
    "secure_aggregation": SA,
}


@contextmanager
def _served(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, FakeClock]]:
    upgrade(db_url)
    settings = Settings(database_url=db_url, admin_token=ADMIN, data_dir=tmp_path)
    clock = FakeClock()
    with TestClient(create_app(settings, sweep=False)) as client:
        client.app.state.service.clock = clock
        yield client, clock


@pytest.fixture
def secure_api(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, FakeClock]]:
    """Both backends (the aggregate and what is stored)."""
    with _served(db_url, tmp_path) as served:
        yield served


@pytest.fixture
def sqlite_api(tmp_path: Path) -> Iterator[tuple[TestClient, FakeClock]]:
    """SQLite only: the stage rules do not depend on the backend, and the suite's time is short."""
    with _served(f"sqlite:///{tmp_path / 'fedprompt.db'}", tmp_path) as served:
        yield served


def _federation(
    api: TestClient, n: int = N, spec: dict[str, Any] | None = None
) -> tuple[int, list[ScriptedClient]]:
    fid = api.post("/api/v1/federations", json=spec or SPEC, headers=ADMIN_AUTH).json()["id"]
    enrol = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_AUTH).json()[
        "token"
    ]
    rng = np.random.default_rng(fid)
    clients = []
    for i in range(n):
        weight = int(rng.integers(1, 50))
        got = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": weight},
            headers={"Authorization": f"Bearer {enrol}"},
        ).json()
        clients.append(
            ScriptedClient(
                api, fid, got["client_id"], got["token"], rng.uniform(-0.4, 0.4, 32), weight, seed=i
            )
        )
    return fid, clients


def _drive(api: TestClient, clients: list[ScriptedClient], fid: int, clock: FakeClock, *, until: int) -> None:
    """Let the clients answer until `until` versions exist; move the clock past deadlines when idle."""
    for _ in range(200):
        if api.get(f"/api/v1/federations/{fid}", headers=ADMIN_AUTH).json()["latest_version"] >= until:
            return
        if not any([c.step() is not None for c in clients]):
            clock.advance(61)
            api.app.state.service.cycle.sweep()
    raise AssertionError("the federation did not reach the version")


def _version(api: TestClient, fid: int, version: int) -> np.ndarray:
    blob = api.get(f"/api/v1/federations/{fid}/prompts/{version}", headers=ADMIN_AUTH).content
    tensors, _ = wire.decode(blob)
    return protocol.flatten(tensors, FederationSpec.model_validate(SPEC).tensor_shapes())


def _expected(api: TestClient, fid: int, survivors: list[ScriptedClient]) -> np.ndarray:
    base = _version(api, fid, 0)
    total = sum(c.weight for c in survivors)
    return base + sum(c.weight * c.update for c in survivors) / total


def _rounds(api: TestClient, fid: int) -> list[dict[str, Any]]:
    return api.get(f"/api/v1/federations/{fid}/rounds", headers=ADMIN_AUTH).json()


def test_secure_round_equals_fedavg_and_stores_no_update(secure_api, db_url: str) -> None:  # type: ignore[no-untyped-def]
    api, clock = secure_api
    fid, clients = _federation(api)
    _drive(api, clients, fid, clock, until=1)
    got = _version(api, fid, 1)
    bound = quantise.error_bound(SA["clip"], SA["bits"])
    assert np.abs(got - _expected(api, fid, clients)).max() <= bound + 1e-6  # float32 storage
    record = _rounds(api, fid)[0]["stats"]["secure_aggregation"]
    assert record["k"] == 4 and record["t"] == 3 and record["dropped_at"] == {}  # graph rule at m = 10
    assert record["completed"]["masked"] == sorted(c.client_id for c in clients)
    # every stored blob: masked vectors and envelopes, none equal or close to an update
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        blobs = [b for (b,) in s.execute(select(Update.blob))] + [
            p for (p,) in s.execute(select(SecaggMessage.payload))
        ]
    engine.dispose()
    updates = [c.update for c in clients] + [
        initial_prompt(FederationSpec.model_validate(SPEC))["prompt_embeddings"].ravel() + c.update
        for c in clients
    ]
    for blob in blobs:
        assert not close_to_any(blob, updates)
    assert close_to_any(wire.encode({"prompt_embeddings": clients[0].update.reshape(4, 8)}), updates)


def test_dropouts_at_every_stage(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    api, clock = sqlite_api
    # a complete graph: every client keeps t neighbours through every stage (3 of 10 drop here, more
    # than the default k is sized for: graph.DROPOUT_FRACTION)
    fid, clients = _federation(api, spec={**SPEC, "secure_aggregation": {**SA, "neighbours": 9}})
    clients[1].stop_after = "keys"
    clients[4].stop_after = "shares"
    clients[7].stop_after = "masked"
    _drive(api, clients, fid, clock, until=1)
    survivors = [c for i, c in enumerate(clients) if i not in (1, 4)]
    got = _version(api, fid, 1)
    assert np.abs(got - _expected(api, fid, survivors)).max() <= quantise.error_bound(1.0, 20) + 1e-6
    first = _rounds(api, fid)[0]
    assert first["secure_aggregation"]["stage"] == "done"
    assert first["secure_aggregation"]["dropped_at"] == first["stats"]["secure_aggregation"]["dropped_at"]
    record = first["stats"]["secure_aggregation"]
    assert set(record["bytes_up"]) == {"keys", "shares", "masked", "consistency", "unmask"}
    assert all(v > 0 for v in record["bytes_up"].values())
    now = api.get(f"/api/v1/federations/{fid}/rounds/2", headers=ADMIN_AUTH).json()["secure_aggregation"]
    assert now["stage"] in ("keys", "shares", "masked", "consistency", "unmask")
    status = api.get(f"/api/v1/federations/{fid}", headers=ADMIN_AUTH).json()
    assert "not any one update" in status["privacy_guarantees"]["secure_aggregation"]
    assert record["dropped_at"] == {
        str(clients[1].client_id): "shares",
        str(clients[4].client_id): "masked",
        str(clients[7].client_id): "consistency",
    }
    scrape = api.get("/metrics").text
    for stage in ("shares", "masked", "consistency"):
        assert f'fedprompt_secagg_dropped{{federation="{fid}",stage="{stage}"}} 1.0' in scrape


def test_fewer_than_t_fails_and_is_retried(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    api, clock = sqlite_api
    fid, clients = _federation(api)
    for c in clients[:6]:
        c.stop_after = "shares"  # 4 masked vectors, below min_clients = 5
    for _ in range(30):
        if not any([c.step() is not None for c in clients]):
            break
    clock.advance(61)
    api.app.state.service.cycle.sweep()
    rounds = _rounds(api, fid)
    assert [(r["round"], r["attempt"], r["state"]) for r in rounds][:2] == [(1, 1, "failed"), (1, 2, "open")]
    assert "minimum of clients of 5" in rounds[0]["failure_reason"]
    for c in clients:
        c.stop_after = None
    _drive(api, clients, fid, clock, until=1)
    assert (
        np.abs(_version(api, fid, 1) - _expected(api, fid, clients)).max()
        <= quantise.error_bound(1.0, 20) + 1e-6
    )


def test_replayed_and_altered_masked_uploads_are_refused(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    api, clock = sqlite_api
    fid, clients = _federation(api)
    _drive(api, clients, fid, clock, until=1)
    first = clients[0]
    body = first.last_masked
    assert body is not None
    url = f"/api/v1/federations/{fid}/rounds/1/update"
    # the same body again for round 1: acknowledged, not stored twice
    assert api.put(url, content=body, headers=first.headers).status_code == 200
    # replayed into round 2 (its keys stage): refused
    again = api.put(f"/api/v1/federations/{fid}/rounds/2/update", content=body, headers=first.headers)
    assert again.status_code == 409, again.text
    # played through to round 2's masked stage, a replay of round 1's vector names the wrong round
    for _ in range(10):
        for c in clients:
            if c is not first:
                c.step()
        task = api.get(f"/api/v1/federations/{fid}/task", headers=first.headers).json()
        if task["kind"] == "train":
            break
        first.step()
    refused = api.put(f"/api/v1/federations/{fid}/rounds/2/update", content=body, headers=first.headers)
    assert refused.status_code == 422 and "round" in refused.json()["detail"]
    first.step()  # its real masked vector for round 2
    altered = bytearray(first.last_masked or b"")
    altered[-1] ^= 1
    answer = api.put(
        f"/api/v1/federations/{fid}/rounds/2/update", content=bytes(altered), headers=first.headers
    )
    assert answer.status_code == 409, answer.text


def test_robust_rule_with_secure_aggregation_is_refused(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    api, _ = sqlite_api
    answer = api.post(
        "/api/v1/federations", json={**SPEC, "aggregation": {"name": "median"}}, headers=ADMIN_AUTH
    )
    assert answer.status_code == 422
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert "robust rule needs each update" in answer.json()["detail"]


def test_the_coordinators_own_data_opens_no_single_update(sqlite_api) -> None:  # type: ignore[no-untyped-def]
    """What the coordinator holds after a round (masked vectors, weights, every revealed share) rebuilds
    each survivor's self-mask seed, as unmasking must; removing that mask from one client's vector
    still leaves its pairwise masks, so no update comes out. The same steps applied to a vector masked
    without pairwise masks give the update back: the check can fail."""
    api, clock = sqlite_api
    fid, clients = _federation(api)
    _drive(api, clients, fid, clock, until=1)
    spec = FederationSpec.model_validate(SPEC)
    size = sum(int(np.prod(s)) for s in spec.tensor_shapes().values())
    with api.app.state.service.store.sessions() as s:
        rnd = s.scalars(select(Round).where(Round.federation_id == fid, Round.number == 1)).one()
        plan = rules.Plan.from_json(s.get(SecaggRound, rnd.id).plan)
        revealed = msgs.revealed(s, rnd.id, plan)
        blobs = {
            cid: (blob, w)
            for cid, blob, w in s.execute(
                select(Update.client_id, Update.blob, Update.num_samples).where(Update.round_id == rnd.id)
            )
        }

    def opened(vector: np.ndarray, seed: bytes, weight: int) -> np.ndarray:
        rest = vector - masks.expand(seed, size)
        return quantise.dequantise(rest.astype(np.float64) / weight, SA["clip"], SA["bits"])

    bound = quantise.error_bound(SA["clip"], SA["bits"])
    for c in clients:
        index = plan.indices[c.client_id]
        seed = shamir.reconstruct(revealed[index], plan.t)
        blob, weight = blobs[c.client_id]
        assert np.abs(opened(protocol.decode_masked(blob, size), seed, weight) - c.update).max() > 0.1
    # the control: the first client's vector had it masked with no neighbour
    first = clients[0]
    own = first.stages.secrets_for(1, 1)
    levels = quantise.weighted(quantise.quantise(first.update, SA["clip"], SA["bits"]), first.weight)
    alone = protocol.masked_vector(own, plan.indices[first.client_id], levels, {}, b"unused")
    assert np.abs(opened(alone, own.self_seed, first.weight) - first.update).max() <= bound + 1e-9
