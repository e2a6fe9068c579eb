"""Per-class evaluation: workers send their confusion matrix in the report's metrics, the coordinator sums
the matrices across clients (per-class accuracy, macro-F1), older reports without one still summarise."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.dashboard.view import timeline
from fedprompt.coordinator.logic.evaluation import summarize_evaluations
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared.evalstats import (
    confusion_metrics,
    is_class_count,
    macro_f1,
    per_class_accuracy,
    read_confusion,
    sum_confusions,
)

from tests.helpers import ADMIN, SMALL_SPEC, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


def _row(n: int, accuracy: float, metrics: dict[str, Any] | None) -> SimpleNamespace:
    return SimpleNamespace(num_samples=n, accuracy=accuracy, loss=0.5, metrics=metrics)


def test_a_confusion_matrix_travels_as_flat_counts_and_back() -> None:
    matrix = [[5, 1], [2, 4]]
    metrics = confusion_metrics(matrix)

    assert metrics == {"confusion_0_0": 5, "confusion_0_1": 1, "confusion_1_0": 2, "confusion_1_1": 4}
    assert all(is_class_count(k) for k in metrics) and not is_class_count("asr_samples")
    assert read_confusion(metrics | {"asr": 0.1}) == matrix
    assert read_confusion({"confusion_0_0": 1.0, "confusion_1_1": 2.0}) is None  # not k x k
    assert (
        read_confusion({"confusion_0_0": -1, "confusion_0_1": 0, "confusion_1_0": 0, "confusion_1_1": 0})
        is None
    )
    assert read_confusion({"asr": 0.5}) is None


def test_macro_f1_and_per_class_accuracy_of_a_majority_guesser() -> None:
    # 86 % ham, everything predicted ham: accuracy 0.86, but spam is never found
    matrix = [[86, 0], [14, 0]]

    assert per_class_accuracy(matrix) == [1.0, 0.0]
    assert macro_f1(matrix) == pytest.approx((2 * 86 / (100 + 86) + 0.0) / 2)
    assert per_class_accuracy([[0, 0], [1, 1]]) == [None, 0.5]


def test_summary_sums_the_clients_matrices_and_keeps_other_metrics_weighted() -> None:
    rows = [
        _row(10, 0.8, confusion_metrics([[5, 0], [2, 3]]) | {"asr": 0.5, "asr_samples": 5}),
        _row(30, 0.7, confusion_metrics([[10, 5], [4, 11]]) | {"asr": 0.1, "asr_samples": 15}),
    ]

    out = summarize_evaluations(3, rows)

    assert out is not None
    assert out["confusion"] == [[15, 5], [6, 14]]
    assert out["per_class_accuracy"] == [15 / 20, 14 / 20] and out["per_class_samples"] == [20, 20]
    assert out["macro_f1"] == pytest.approx(macro_f1([[15, 5], [6, 14]]))
    assert out["accuracy"] == pytest.approx((8 + 21) / 40)
    assert out["asr"] == pytest.approx((0.5 * 5 + 0.1 * 15) / 20) and out["asr_samples"] == 20
    assert not any(is_class_count(k) for k in out)  # the cells are not averaged into the summary


def test_summary_of_reports_without_counts_has_no_per_class_figures() -> None:
    old = [_row(10, 0.5, {}), _row(10, 0.7, None)]
    mixed = [_row(10, 0.5, confusion_metrics([[3, 2], [3, 2]])), _row(10, 0.7, {"asr": 0.2})]

    for rows in (old, mixed):
        out = summarize_evaluations(1, rows)
        assert out is not None and out["accuracy"] == pytest.approx(0.6)
        assert "macro_f1" not in out and "per_class_accuracy" not in out
    assert sum_confusions([[[1]], [[1, 0], [0, 1]]]) is None  # sizes differ


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'classes.db'}"
    upgrade(url)
    settings = Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path)
    with TestClient(create_app(settings, sweep=False), follow_redirects=False) as client:
        yield client


def test_reports_with_matrices_reach_the_round_summary_and_the_dashboard(api: TestClient) -> None:
    fid = api.post("/api/v1/federations", json=SMALL_SPEC, headers=ADMIN_H).json()["id"]
    token = api.post(f"/api/v1/federations/{fid}/enrollment-tokens", json={}, headers=ADMIN_H).json()["token"]
    heads = []
    for i in range(2):
        answer = api.post(
            f"/api/v1/federations/{fid}/clients",
            json={"name": f"site-{i}", "num_samples": 10},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        heads.append({"Authorization": f"Bearer {answer['token']}"})
    for i, h in enumerate(heads):
        body = update_blob(SMALL_SPEC, i, base_version=0, metrics={"loss": 0.5})
        assert (
            api.put(f"/api/v1/federations/{fid}/rounds/1/update", content=body, headers=h).status_code == 201
        )
    for matrix, h in zip(([[9, 1], [5, 5]], [[8, 2], [2, 8]]), heads, strict=True):
        report = {"num_samples": 20, "accuracy": (matrix[0][0] + matrix[1][1]) / 20, "loss": 0.6}
        report["metrics"] = confusion_metrics(matrix)
        resp = api.post(f"/api/v1/federations/{fid}/rounds/1/evaluation", json=report, headers=h)
        assert resp.status_code == 201, resp.text

    (closed,) = [
        r for r in api.get(f"/api/v1/federations/{fid}/rounds", headers=ADMIN_H).json() if r["round"] == 1
    ]

    ev = closed["evaluation"]
    assert ev["confusion"] == [[17, 3], [7, 13]]
    assert ev["per_class_accuracy"] == [17 / 20, 13 / 20]
    assert ev["macro_f1"] == pytest.approx(macro_f1([[17, 3], [7, 13]]))
    (row,) = [r for r in timeline([closed], quorum=1, now=closed["closed_at"]) if r["round"] == 1]
    assert row["macro_f1"] == ev["macro_f1"] and row["per_class_accuracy"] == ev["per_class_accuracy"]
    api.post("/dashboard/login", data={"token": ADMIN})
    page = api.get("/dashboard", params={"federation": fid})
    assert page.status_code == 200 and "macro-F1" in page.text
