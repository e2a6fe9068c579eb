"""SCAFFOLD through the coordinator's HTTP API on every backend: uploads carry Δc_i beside the prompt,
the prompt version is the FedAvg of the prompts alone, the server's control variate moves by
ΣΔc_i / N and is served beside the prompt, its download is counted in the ledger, and an update
without its control tensors is refused with the database unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from fedprompt.shared import drift, wire
from fedprompt.shared.spec import FederationSpec

from tests.helpers import ADMIN_AUTH, SMALL_SPEC, enrol_clients, random_tensors

SPEC = {**SMALL_SPEC, "drift_correction": {"name": "scaffold"}, "rounds": 3, "min_clients": 3}
API = "/api/v1/federations"


def _update(
    spec: FederationSpec, seed: int, n: int, base: int, control: bool = True
) -> tuple[bytes, dict[str, Any]]:
    prompt = random_tensors(spec, seed)
    delta = {k: v * 0.01 for k, v in random_tensors(spec, seed + 100).items()}
    tensors = {**prompt, **(drift.prefixed(delta) if control else {})}
    meta = {"num_samples": str(n), "method": "prompt_tuning", "base_version": str(base)}
    return wire.encode(tensors, meta), {"prompt": prompt, "delta": delta}


def test_a_scaffold_round_over_http(api: TestClient) -> None:
    spec = FederationSpec.model_validate(SPEC)
    fid, clients = enrol_clients(api, SPEC, 3, num_samples=30)
    # round 1 opened at the third enrolment, with every client (C = 1)
    zero = wire.decode(api.get(f"{API}/{fid}/prompts/0/control", headers=clients[0]).content)[0]
    assert all(not a.any() for a in zero.values()) and set(zero) == set(spec.tensor_shapes())

    # an update without its Δc_i is refused, and nothing is stored
    bare, _ = _update(spec, 1, 10, 0, control=False)
    refused = api.put(f"{API}/{fid}/rounds/1/update", content=bare, headers=clients[0])
    assert refused.status_code == 422 and "control/prompt_embeddings" in refused.json()["detail"]
    assert not any(
        p["uploaded"] for p in api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json()[0]["participants"]
    )

    sent = []
    for i, (headers, n) in enumerate(zip(clients, (10, 30, 20), strict=True)):
        task = api.get(f"{API}/{fid}/task", headers=headers).json()
        if task["kind"] == "evaluate":  # version 0 first
            report = {"num_samples": 10, "accuracy": 0.5}
            api.post(f"{API}/{fid}/rounds/0/evaluation", json=report, headers=headers)
            task = api.get(f"{API}/{fid}/task", headers=headers).json()
        assert task["kind"] == "train" and task["config"]["drift_correction"]["name"] == "scaffold"
        api.get(f"{API}/{fid}/prompts/0", headers=headers)
        control = api.get(f"{API}/{fid}/prompts/0/control", headers=headers)
        assert control.status_code == 200
        blob, parts = _update(spec, i + 1, n, 0)
        assert api.put(f"{API}/{fid}/rounds/1/update", content=blob, headers=headers).status_code == 201
        sent.append(
            (
                n,
                parts,
                len(api.get(f"{API}/{fid}/prompts/0", headers=ADMIN_AUTH).content) + len(control.content),
            )
        )

    fed = api.get(f"{API}/{fid}", headers=ADMIN_AUTH).json()
    assert fed["latest_version"] == 1
    got = wire.decode(api.get(f"{API}/{fid}/prompts/1", headers=ADMIN_AUTH).content)[0]
    assert set(got) == {"prompt_embeddings"}  # the version holds the prompt only
    total = sum(n for n, _, _ in sent)
    want = sum(n * p["prompt"]["prompt_embeddings"].astype(np.float64) for n, p, _ in sent) / total
    np.testing.assert_allclose(got["prompt_embeddings"], want, rtol=1e-6, atol=1e-6)
    # c = 0 + ΣΔc_i / N, N = 3 enrolled
    c1 = wire.decode(api.get(f"{API}/{fid}/prompts/1/control", headers=clients[0]).content)[0]
    want_c = sum(p["delta"]["prompt_embeddings"].astype(np.float64) for _, p, _ in sent) / 3
    np.testing.assert_allclose(c1["prompt_embeddings"], want_c, rtol=1e-5, atol=1e-7)
    # version 0's is zero by definition, also after the state moved on
    again = wire.decode(api.get(f"{API}/{fid}/prompts/0/control", headers=clients[0]).content)[0]
    assert not again["prompt_embeddings"].any()
    # the ledger counts prompt and control variate downloaded by each participant
    stats = api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json()[0]["stats"]
    assert stats["bytes_down"] == sum(size for _, _, size in sent)


def test_no_control_variate_without_scaffold(api: TestClient) -> None:
    fid = api.post(API, json=SMALL_SPEC, headers=ADMIN_AUTH).json()["id"]
    missing = api.get(f"{API}/{fid}/prompts/0/control", headers=ADMIN_AUTH)
    assert missing.status_code == 404 and "does not use SCAFFOLD" in missing.json()["detail"]
