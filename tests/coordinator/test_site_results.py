"""Per-site results: each site's own evaluation of a version and their spread, through the API (on
every backend), on the dashboard, and in simulate's results; private under secure aggregation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.logic.evaluation import spread
from fedprompt.shared.evalstats import confusion_metrics
from fedprompt.sim.results import attach_sites, write_results

from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC, enrol_clients

API = "/api/v1/federations"


def test_the_spread_of_the_sites() -> None:
    got = spread([{"accuracy": 0.5}, {"accuracy": 0.9}, {"accuracy": 0.7}])
    assert got is not None
    assert (got["sites"], got["min"], got["max"]) == (3, 0.5, 0.9)
    assert got["mean"] == pytest.approx(0.7) and got["std"] == pytest.approx((0.08 / 3) ** 0.5)
    assert spread([]) is None


def test_each_sites_evaluation_through_the_api_and_the_dashboard(api: TestClient) -> None:
    fid, (a, b) = enrol_clients(api, SMALL_SPEC, 2)
    reports = [([[8, 2], [2, 8]], a), ([[10, 0], [10, 0]], b)]  # site-1 calls everything label 0
    for confusion, headers in reports:
        body = {"num_samples": 20, "accuracy": sum(confusion[i][i] for i in range(2)) / 20}
        body["metrics"] = confusion_metrics(confusion)
        assert api.post(f"{API}/{fid}/rounds/0/evaluation", json=body, headers=headers).status_code == 201
    got = api.get(f"{API}/{fid}/evaluations/0/sites", headers=ADMIN_AUTH).json()
    assert [(s["name"], s["accuracy"], s["num_samples"]) for s in got["sites"]] == [
        ("site-0", 0.8, 20),
        ("site-1", 0.5, 20),
    ]
    assert got["sites"][0]["macro_f1"] == pytest.approx(0.8) and got["sites"][1]["per_class_accuracy"] == [
        1.0,
        0.0,
    ]
    assert got["spread"]["min"] == 0.5 and got["spread"]["max"] == 0.8
    assert api.get(f"{API}/{fid}/evaluations/5/sites", headers=ADMIN_AUTH).status_code == 404
    assert api.post("/dashboard/login", data={"token": ADMIN}).status_code == 200
    page = api.get(f"/dashboard/live?federation={fid}").text
    assert "data-site-table" in page and "site-1" in page and "50.0" in page


def test_secure_aggregation_keeps_the_sites_private(api: TestClient) -> None:
    spec = {**SMALL_SPEC, "min_clients": 3, "secure_aggregation": {"clip": 1.0}}
    fid = api.post(API, json=spec, headers=ADMIN_AUTH).json()["id"]
    refused = api.get(f"{API}/{fid}/evaluations/0/sites", headers=ADMIN_AUTH)
    assert refused.status_code == 403 and "label mix" in refused.json()["detail"]
    opted = {**spec, "secure_aggregation": {"clip": 1.0, "report_confusion": True}}
    fid = api.post(API, json=opted, headers=ADMIN_AUTH).json()["id"]
    assert api.get(f"{API}/{fid}/evaluations/0/sites", headers=ADMIN_AUTH).status_code == 200


def test_simulate_writes_the_sites_into_results_and_rounds_csv(tmp_path: Path) -> None:
    from fedprompt.shared.spec import FederationSpec

    spec = FederationSpec.model_validate(SMALL_SPEC).model_dump()
    record: dict[str, Any] = {"round": 1, "accuracy": 0.65, "bytes_up": 1, "bytes_down": 1, "confusion": None}
    sites = {
        "sites": [
            {"client_id": 1, "name": "a", "num_samples": 20, "accuracy": 0.8, "macro_f1": 0.8},
            {"client_id": 2, "name": "b", "num_samples": 20, "accuracy": 0.5, "macro_f1": 0.33},
        ],
        "spread": {"sites": 2, "min": 0.5, "max": 0.8, "mean": 0.65, "std": 0.15},
    }
    records = [dict(record), {**record, "round": 2}]
    attach_sites(records, lambda v: sites if v == 1 else None)  # round 2: private
    assert records[0]["sites"][1] == {"name": "b", "num_samples": 20, "accuracy": 0.5, "macro_f1": 0.33}
    assert "sites" not in records[1]
    results = write_results(tmp_path, spec, records, None, 1.0, {"labels": None})
    assert results["rounds"][0]["site_min_accuracy"] == 0.5
    lines = (tmp_path / "rounds.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert lines[1].split(",")[header.index("site_max_accuracy")] == "0.8"
