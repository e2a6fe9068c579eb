"""The coordinator's privacy ledger: each client's cumulative ε composed per mechanism, in the round
history and the federation status, from the updates it actually sent (not from what they claim)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from fedprompt.shared.privacy import gaussian_noise_multiplier, spent_epsilon

from tests.helpers import ADMIN, SMALL_SPEC, federation_with_clients, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.mark.parametrize(
    "privacy",
    [
        {"mechanism": "laplace", "epsilon": 2.0, "clip": 10.0},
        {"mechanism": "gaussian", "epsilon": 2.0, "delta": 1e-5, "clip": 10.0},
    ],
)
def test_cumulative_epsilon_composes_over_the_rounds_each_client_took_part_in(
    api: TestClient, privacy: dict
) -> None:
    spec = {**SMALL_SPEC, "rounds": 2, "min_clients": 2, "expected_clients": 2, "privacy": privacy}
    fid, _, clients = federation_with_clients(api, 2, spec=spec)
    service = api.app.state.service
    for number in (1, 2):
        for i, c in enumerate(clients):
            # one client claims a tiny epsilon: the ledger counts the release, not the claim
            blob = update_blob(spec, 10 * number + i, base_version=number - 1, metrics={"epsilon": 1e-9})
            resp = api.put(
                f"/api/v1/federations/{fid}/rounds/{number}/update",
                content=blob,
                headers={"Authorization": f"Bearer {c['token']}"},
            )
            assert resp.status_code == 201, resp.text
        service.cycle.after_upload(fid)
        stats = api.get(f"/api/v1/federations/{fid}/rounds/{number}", headers=ADMIN_H).json()["stats"]
        expected = spent_epsilon(privacy["mechanism"], 2.0, privacy.get("delta"), number)
        assert stats["privacy"]["mechanism"] == privacy["mechanism"]
        assert list(stats["privacy"]["cumulative_epsilon"].values()) == pytest.approx([expected, expected])
    status = api.get(f"/api/v1/federations/{fid}", headers=ADMIN_H).json()["privacy"]
    two_rounds = status["max_cumulative_epsilon"]
    if privacy["mechanism"] == "laplace":
        assert two_rounds == 4.0  # basic composition
        assert "noise_multiplier" not in status
    else:
        assert 2.0 < two_rounds < 4.0  # the accountant composes tighter than 2 × ε
        assert status["noise_multiplier"] == pytest.approx(gaussian_noise_multiplier(2.0, 1e-5))
    assert len(status["cumulative_epsilon"]) == 2
