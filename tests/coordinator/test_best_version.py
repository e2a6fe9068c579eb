"""The collapse guard and the best version: the rule on literal summaries, and through the HTTP API on
every backend (the federation's best_version, the 'best' prompt alias, the export's default, the
'version_collapsed' event, its gauge and the dashboard's badge)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from fedprompt.coordinator.logic.evaluation import best_version, collapsed, one_class, predicted_share
from fedprompt.shared.evalstats import confusion_metrics

from tests.helpers import ADMIN, ADMIN_AUTH, SMALL_SPEC, enrol_clients, update_blob

API = "/api/v1/federations"


def _summary(
    version: int, confusion: list[list[int]] | None, accuracy: float, f1: float | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"version": version, "accuracy": accuracy, "macro_f1": f1}
    if confusion is not None:
        out |= {"confusion": confusion, "per_class_samples": [sum(r) for r in confusion]}
    return out


def test_a_constant_predictor_is_flagged_and_never_best() -> None:
    assert predicted_share([[10, 0], [9, 1]]) == (0, 0.95)
    assert collapsed(_summary(3, [[50, 0], [50, 0]], 0.5, 1 / 3))
    assert collapsed(_summary(3, [[99, 1], [100, 0]], 0.495, 0.33))  # 199 of 200 predicted 0
    assert not collapsed(_summary(3, [[95, 5], [90, 10]], 0.525, 0.4))  # 92.5 %: skewed, not constant
    assert not collapsed(_summary(3, [[100, 0], [0, 0]], 1.0, 0.5))  # one label in the data: nothing to say
    assert not collapsed(_summary(3, None, 0.5, None))
    assert one_class([[4, 0], [6, 0]]) and not one_class([[4, 0], [5, 1]])
    # the majority class of a skewed test set can out-score a real classifier on accuracy, never on
    # macro-F1; and a collapsed version is passed over even where its figure is higher
    versions = [
        _summary(0, [[30, 30], [10, 30]], 0.6, 0.59),
        _summary(1, [[60, 0], [40, 0]], 0.6, 0.375),
        _summary(2, [[50, 10], [15, 25]], 0.75, 0.73),
        _summary(3, [[60, 0], [39, 1]], 0.61, 0.9),  # implausible figure, but collapsed: never best
    ]
    assert best_version(versions) == {"version": 2, "metric": "macro_f1", "value": 0.73}
    # without confusion matrices the rule ranks accuracy; a tie goes to the later version
    plain = [_summary(0, None, 0.7, None), _summary(1, None, 0.8, None), _summary(2, None, 0.8, None)]
    assert best_version(plain) == {"version": 2, "metric": "accuracy", "value": 0.8}
    # every version collapsed: the best of them, rather than none
    assert best_version([versions[1]]) == {"version": 1, "metric": "macro_f1", "value": 0.375}
    assert best_version([]) is None


def _report(
    api: TestClient, fid: int, version: int, headers: dict[str, str], confusion: list[list[int]]
) -> None:
    n = sum(map(sum, confusion))
    body = {
        "num_samples": n,
        "accuracy": sum(confusion[i][i] for i in range(len(confusion))) / n,
        "metrics": confusion_metrics(confusion),
    }
    assert api.post(f"{API}/{fid}/rounds/{version}/evaluation", json=body, headers=headers).status_code in (
        200,
        201,
    )


def _round(api: TestClient, fid: int, number: int, clients: list[dict[str, str]]) -> None:
    for i, headers in enumerate(clients):
        blob = update_blob(SMALL_SPEC, number * 10 + i, num_samples=10, base_version=number - 1)
        assert (
            api.put(f"{API}/{fid}/rounds/{number}/update", content=blob, headers=headers).status_code == 201
        )


def _events(api: TestClient, fid: int) -> list[dict[str, Any]]:
    return [
        e
        for e in api.get(f"{API}/{fid}/events", headers=ADMIN_AUTH).json()
        if e["kind"] == "version_collapsed"
    ]


def test_the_best_version_is_handed_out_and_a_collapse_is_recorded(api: TestClient) -> None:
    fid, clients = enrol_clients(api, SMALL_SPEC, 2, num_samples=30)
    assert api.get(f"{API}/{fid}", headers=ADMIN_AUTH).json()["best_version"] is None
    for headers in clients:
        _report(api, fid, 0, headers, [[8, 2], [3, 7]])
    _round(api, fid, 1, clients)
    _report(api, fid, 1, clients[0], [[10, 0], [10, 0]])  # half of the clients: enough to tell
    assert [e["round"] for e in _events(api, fid)] == [1]
    assert "constant predictor" in _events(api, fid)[0]["message"]
    _report(api, fid, 1, clients[1], [[10, 0], [9, 0]])
    assert len(_events(api, fid)) == 1  # once per version
    _round(api, fid, 2, clients)
    for headers in clients:
        _report(api, fid, 2, headers, [[6, 4], [4, 6]])

    status = api.get(f"{API}/{fid}", headers=ADMIN_AUTH).json()
    assert status["latest_version"] == 2
    best = status["best_version"]
    assert best["version"] == 0 and best["metric"] == "macro_f1" and "collapsed" in best["rule"]
    assert best["evaluation"]["clients"] == 2 and best["evaluation"]["collapsed"] is False
    rounds = api.get(f"{API}/{fid}/rounds", headers=ADMIN_AUTH).json()
    assert [r["evaluation"]["collapsed"] for r in rounds[:2]] == [True, False]  # round 3 is open

    got = api.get(f"{API}/{fid}/prompts/best", headers=clients[0])
    assert got.status_code == 200 and got.headers["X-Prompt-Version"] == "0"
    export = api.get(f"{API}/{fid}/export", headers=ADMIN_AUTH)
    assert export.status_code == 200 and "-v0-peft.zip" in export.headers["content-disposition"]
    latest = api.get(f"{API}/{fid}/export", params={"version": "latest"}, headers=ADMIN_AUTH)
    assert "-v2-peft.zip" in latest.headers["content-disposition"]

    scrape = api.get("/metrics").text
    assert f'fedprompt_collapsed_versions{{federation="{fid}"}} 1.0' in scrape
    assert api.post("/dashboard/login", data={"token": ADMIN}).status_code == 200  # follows to /dashboard
    page = api.get(f"/dashboard/live?federation={fid}")
    assert page.status_code == 200
    assert "data-collapsed" in page.text and "data-best-version" in page.text
