"""The coordinator with non-default methods: refusals by method / fingerprint, ledger, PEFT export route."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec

from tests.coordinator.test_api import is_problem, snapshot
from tests.helpers import ADMIN, random_tensors

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
FINGERPRINT = "0123456789abcdef"
SPEC: dict[str, Any] = {
    "name": "p-tuning",
    "method": "p_tuning",
    "encoder_hidden_size": 6,
    "num_virtual_tokens": 3,
    "hidden_size": 8,
    "num_layers": 2,
    "num_attention_heads": 2,
    "model_fingerprint": FINGERPRINT,
    "params_full_model": 10_000,
    "min_clients": 2,
    "quorum": 1,
    "rounds": 2,
}


@pytest.fixture
def api(db_url: str, tmp_path) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    upgrade(db_url)
    settings = Settings(database_url=db_url, admin_token=ADMIN, data_dir=tmp_path)
    with TestClient(create_app(settings, sweep=False)) as client:
        yield client


@pytest.fixture
def world(api: TestClient) -> dict[str, Any]:
    """A P-tuning federation with two clients and round 1 open."""
    fid = api.post("/api/v1/federations", json=SPEC, headers=ADMIN_H).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_H).json()["token"]
    heads = []
    for i in range(2):
        r = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": 10, "info": {"model_fingerprint": FINGERPRINT}},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert r.status_code == 201, r.text
        heads.append({"Authorization": f"Bearer {r.json()['token']}"})
    assert api.get(f"/api/v1/federations/{fid}/rounds/1", headers=ADMIN_H).json()["state"] == "open"
    return {"fid": fid, "clients": heads}


def _body(seed: int, **meta: Any) -> bytes:
    tensors = random_tensors(FederationSpec.model_validate(SPEC), seed)
    return wire.encode(
        {k: v * 0.1 for k, v in tensors.items()},
        {
            "num_samples": "10",
            "method": "p_tuning",
            "model_fingerprint": FINGERPRINT,
            "base_version": "0",
            **meta,
        },
    )


@pytest.mark.parametrize(
    ("case", "body", "detail"),
    [
        ("other method", lambda: _body(0, method="prefix_tuning"), "method 'prefix_tuning'"),
        ("other fingerprint", lambda: _body(0, model_fingerprint="fedcba9876543210"), "fedcba9876543210"),
        (
            "prompt-tuning tensors",
            lambda: wire.encode(
                {"prompt_embeddings": np.zeros((3, 8), np.float32)},
                {"num_samples": "10", "method": "p_tuning", "model_fingerprint": FINGERPRINT},
            ),
            "prompt_encoder.mlp_head.0.weight",
        ),
    ],
)
def test_upload_naming_another_method_or_model_is_refused(
    api: TestClient, world: dict[str, Any], case: str, body: Any, detail: str
) -> None:
    """problem+json 422 saying what differs; the database is unchanged."""
    before = snapshot(api)
    resp = api.put(
        f"/api/v1/federations/{world['fid']}/rounds/1/update", content=body(), headers=world["clients"][0]
    )
    problem = is_problem(resp, 422)
    assert detail in problem["detail"]
    assert snapshot(api) == before


def test_enrolment_with_another_model_is_refused(api: TestClient, world: dict[str, Any]) -> None:
    """A site reporting another fingerprint cannot enrol (409, nothing stored)."""
    token = api.post(
        f"/api/v1/federations/{world['fid']}/enrollment-tokens", json={}, headers=ADMIN_H
    ).json()["token"]
    before = snapshot(api)
    resp = api.post(
        f"/api/v1/federations/{world['fid']}/clients",
        json={"name": "x", "num_samples": 3, "info": {"model_fingerprint": "ffffffffffffffff"}},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert "ffffffffffffffff" in is_problem(resp, 409)["detail"]
    assert snapshot(api) == before


def test_round_closes_with_ledger_and_exports_as_peft(api: TestClient, world: dict[str, Any]) -> None:
    """Two P-tuning updates average; the ledger counts parameters; the export is a PEFT folder."""
    fid = world["fid"]
    for i, head in enumerate(world["clients"]):
        api.get(f"/api/v1/federations/{fid}/prompts/0", headers=head)
        resp = api.put(f"/api/v1/federations/{fid}/rounds/1/update", content=_body(i + 1), headers=head)
        assert resp.status_code in (200, 201), resp.text
    status = api.get(f"/api/v1/federations/{fid}", headers=ADMIN_H).json()
    assert status["latest_version"] == 1
    ledger = status["ledger"]
    per_client = FederationSpec.model_validate(SPEC).params_communicated()
    assert per_client == 3 * 8 + (8 * 6 + 6) + (6 * 6 + 6) + (6 * 8 + 8)
    assert ledger["params_communicated"] == per_client
    assert ledger["comm_ratio"] == pytest.approx(per_client / 10_000)
    assert ledger["rounds"] == [
        {
            "round": 1,
            "participants": 2,
            "uploads": 2,
            "bytes_up": ledger["rounds"][0]["bytes_up"],
            "bytes_down": ledger["rounds"][0]["bytes_down"],
            "params_up": 2 * per_client,
            "params_down": 2 * per_client,
        }
    ]
    assert ledger["rounds"][0]["bytes_up"] > 4 * per_client * 2
    assert ledger["totals"]["params_up"] == 2 * per_client
    assert len(ledger["clients"]) == 2
    for row in ledger["clients"].values():  # each client downloaded version 0 and uploaded once
        assert row["uploads"] == row["downloads"] == 1
        assert row["params_up"] == row["params_down"] == per_client
        assert row["bytes_up"] > 4 * per_client and row["bytes_down"] > 0
    assert sum(r["bytes_up"] for r in ledger["clients"].values()) == ledger["totals"]["bytes_up"]

    resp = api.get(f"/api/v1/federations/{fid}/export?format=peft&version=latest", headers=ADMIN_H)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(resp.content)) as zf:
        assert sorted(zf.namelist()) == ["adapter_config.json", "adapter_model.safetensors"]
        config = json.loads(zf.read("adapter_config.json"))
        weights = wire.decode(zf.read("adapter_model.safetensors"))[0]
    assert config["peft_type"] == "P_TUNING" and config["encoder_hidden_size"] == 6
    assert list(weights) == ["prompt_embeddings"] and weights["prompt_embeddings"].shape == (3, 8)

    bad = api.get(f"/api/v1/federations/{fid}/export?format=onnx", headers=ADMIN_H)
    assert "peft" in is_problem(bad, 422)["detail"]
    missing = api.get(f"/api/v1/federations/{fid}/export?version=7", headers=ADMIN_H)
    is_problem(missing, 404)
