"""The model size a worker states, at enrolment or once it has loaded the model: the ledger's full
fine-tuning reference when the spec sets none, the first figure kept; absent, it changes nothing;
hostile, a 422 that leaves the database as it was."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.persistence.db import Federation
from sqlalchemy import select

from tests.coordinator.test_api import is_problem, snapshot
from tests.helpers import ADMIN_AUTH, SMALL_SPEC, federation_with_clients

MINILM = 22_713_216
PROMPT = SMALL_SPEC["num_virtual_tokens"] * SMALL_SPEC["hidden_size"]
HOSTILE = [0, -1, 10**13 + 1, 2**63, 2**64, 1.5, str(MINILM), True, None, [MINILM], {"n": MINILM}]


def enrol(api: TestClient, fid: int, token: str, name: str, **body: Any) -> httpx.Response:
    return api.post(
        f"/api/v1/federations/{fid}/clients",
        json={"name": name, "num_samples": 5, **body},
        headers={"Authorization": f"Bearer {token}"},
    )


def state(api: TestClient, fid: int, token: str, body: dict[str, Any]) -> httpx.Response:
    return api.put(
        f"/api/v1/federations/{fid}/model-parameters", json=body, headers={"Authorization": f"Bearer {token}"}
    )


def ledger(api: TestClient, fid: int) -> dict[str, Any]:
    return api.get(f"/api/v1/federations/{fid}", headers=ADMIN_AUTH).json()["ledger"]


def recorded(api: TestClient, fid: int) -> int | None:
    with api.app.state.service.sessions() as s:
        return s.scalar(select(Federation.model_parameters).where(Federation.id == fid))


def test_the_first_stated_model_size_is_the_ledgers_reference(api: TestClient) -> None:
    fid, token, _ = federation_with_clients(api, 0, spec={**SMALL_SPEC, "auto_advance": False})
    assert enrol(api, fid, token, "silent").status_code == 201
    assert enrol(api, fid, token, "null", model_parameters=None).status_code == 201
    before = ledger(api, fid)
    assert before["params_full_model"] is None and before["comm_ratio"] is None and recorded(api, fid) is None

    assert enrol(api, fid, token, "first", model_parameters=MINILM).status_code == 201
    assert enrol(api, fid, token, "other", model_parameters=109_514_298).status_code == 201  # ignored
    # 22713216.0 is an integer, as in JSON Schema (coordinator/api/jsonbody.py)
    assert enrol(api, fid, token, "same", model_parameters=float(MINILM)).status_code == 201

    after = ledger(api, fid)
    assert after["params_full_model"] == MINILM == recorded(api, fid)
    assert after["comm_ratio"] == pytest.approx(PROMPT / MINILM)
    assert api.get(f"/api/v1/federations/{fid}/spec", headers=ADMIN_AUTH).json()["params_full_model"] is None
    events = {e["message"] for e in api.get(f"/api/v1/federations/{fid}/events", headers=ADMIN_AUTH).json()}
    assert any("'first'" in m and "22,713,216 parameters recorded" in m for m in events), events
    assert any("'other'" in m and "differ from the federation's 22,713,216 (ignored)" in m for m in events)
    assert any(m.endswith("'same' enrolled (5 samples)") for m in events), events


def test_the_specs_figure_wins_over_a_stated_one(api: TestClient) -> None:
    fid, token, _ = federation_with_clients(api, 0, spec={**SMALL_SPEC, "params_full_model": 10_000})
    assert enrol(api, fid, token, "a", model_parameters=MINILM).status_code == 201
    assert ledger(api, fid)["params_full_model"] == 10_000
    assert recorded(api, fid) is None


def test_the_largest_allowed_model_size_is_accepted(api: TestClient) -> None:
    fid, token, _ = federation_with_clients(api, 0)
    assert enrol(api, fid, token, "huge", model_parameters=10**13).status_code == 201
    assert recorded(api, fid) == 10**13


@pytest.mark.parametrize("value", [v for v in HOSTILE if v is not None], ids=repr)
def test_a_hostile_model_size_is_422_and_changes_nothing(api: TestClient, value: Any) -> None:
    fid, token, _ = federation_with_clients(api, 0)
    before = snapshot(api)
    problem = is_problem(enrol(api, fid, token, "intruder", model_parameters=value), 422)
    assert "model_parameters" in problem["detail"]
    assert snapshot(api) == before


@pytest.mark.parametrize("raw", ["1e400", "NaN", "Infinity", "-0.5e1", "0x15a9180"])
def test_a_model_size_that_is_no_json_integer_is_refused(api: TestClient, raw: str) -> None:
    fid, token, _ = federation_with_clients(api, 0)
    before = snapshot(api)
    resp = api.post(
        f"/api/v1/federations/{fid}/clients",
        content=f'{{"name": "intruder", "num_samples": 5, "model_parameters": {raw}}}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert resp.status_code in (400, 422), resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert snapshot(api) == before


def test_a_worker_states_its_models_size_once_it_has_loaded_it(api: TestClient) -> None:
    fid, _, clients = federation_with_clients(api, 2, spec={**SMALL_SPEC, "auto_advance": False})
    first, second = (c["token"] for c in clients)
    answer = state(api, fid, first, {"model_parameters": MINILM})
    assert answer.status_code == 200 and answer.json() == {"model_parameters": MINILM}
    before = snapshot(api)
    assert state(api, fid, second, {"model_parameters": 1_000}).json() == {"model_parameters": MINILM}
    assert snapshot(api) == before  # known: the later figure is ignored without a write
    assert ledger(api, fid)["params_full_model"] == MINILM == recorded(api, fid)
    events = [e["message"] for e in api.get(f"/api/v1/federations/{fid}/events", headers=ADMIN_AUTH).json()]
    assert "client 1 'site-0': its model's 22,713,216 parameters recorded as the federation's" in events


def test_a_stated_size_never_overrides_the_specs(api: TestClient) -> None:
    fid, _, clients = federation_with_clients(api, 1, spec={**SMALL_SPEC, "params_full_model": 10_000})
    before = snapshot(api)
    assert state(api, fid, clients[0]["token"], {"model_parameters": MINILM}).json() == {
        "model_parameters": 10_000
    }
    assert snapshot(api) == before and recorded(api, fid) is None


@pytest.mark.parametrize(
    "body",
    [{"model_parameters": v} for v in HOSTILE] + [{}, {"model_parameters": MINILM, "client_id": 2}],
    ids=repr,
)
def test_a_hostile_statement_is_422_and_changes_nothing(api: TestClient, body: dict[str, Any]) -> None:
    fid, _, clients = federation_with_clients(api, 1)
    before = snapshot(api)
    is_problem(state(api, fid, clients[0]["token"], body), 422)
    assert snapshot(api) == before
