# ruff: noqa: F811 (the world fixture is imported from test_operator_cli)
"""Issue 34's surprises of the operator CLI and the API: the default lr of every spec path, `federation
wait` returning only with the final evaluation recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fedprompt.shared.spec import DEFAULT_MODEL, FederationSpec, default_lr

from tests.helpers import SMALL_SPEC
from tests.sim.test_operator_cli import ADMIN_H, World, run, world  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("fields", "lr"),
    [
        ({}, 0.01),  # the default model, MiniLM, has no MLM head: mean-pool scoring
        ({"scoring": "mean-pool"}, 0.01),
        ({"model": "FacebookAI/roberta-base"}, 0.3),  # label words through the MLM head
        ({"model": "/models/all-MiniLM-L6-v2/"}, 0.01),
        ({"model": "/models/all-MiniLM-L6-v2", "scoring": "tied-embeddings"}, 0.3),
        ({"lr": 0.05}, 0.05),
        ({"local_optimizer": "sgd"}, 1.0),  # plain SGD, whatever the scoring
        ({"model": "FacebookAI/roberta-base", "local_optimizer": "sgd"}, 1.0),
        ({"local_optimizer": "sgd", "lr": 0.5}, 0.5),
    ],
)
def test_one_default_lr_rule_for_rest_the_operator_cli_and_simulate(
    world: World, tmp_path: Path, fields: dict, lr: float
) -> None:
    spec = {**SMALL_SPEC, **fields}
    rest = world.api.post("/api/v1/federations", json=spec, headers=ADMIN_H)
    assert rest.status_code == 201, rest.text
    assert rest.json()["spec"]["lr"] == lr
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    created = run("federation", "create", "--spec", str(path), "--json")
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["spec"]["lr"] == lr
    # simulate resolves the scoring through the engine, then the same rule
    resolved = fields.get(
        "scoring", "mean-pool" if "MiniLM" in fields.get("model", DEFAULT_MODEL) else "auto"
    )
    optimizer = fields.get("local_optimizer", "adamw")
    assert FederationSpec.model_validate(spec).lr == fields.get(
        "lr", default_lr(resolved, spec.get("model"), optimizer)
    )


def _report(world: World, version: int, i: int) -> None:
    resp = world.api.post(
        f"/api/v1/federations/{world.fid}/rounds/{version}/evaluation",
        json={"num_samples": 10, "accuracy": 0.5 + 0.1 * i},
        headers=world.clients[i],
    )
    assert resp.status_code == 201, resp.text


def test_federation_wait_returns_only_once_the_final_evaluation_is_recorded(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [lambda n=n, i=i: world.upload(n, i) for n in (1, 2) for i in (0, 1)]
    steps += [lambda: None, lambda: _report(world, 2, 0), lambda: None, lambda: _report(world, 2, 1)]
    slept = world.script(monkeypatch, steps)
    result = run("federation", "wait", "-f", str(world.fid), "--interval", "1", "--json")
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["state"] == "completed"
    assert status["latest"]["evaluation"]["accuracy"] == pytest.approx(0.55)
    assert status["latest"]["evaluation"]["clients"] == 2
    assert len(slept) == len(steps)  # it kept polling through the evaluations


def test_federation_wait_gives_up_on_a_missing_evaluation_after_eval_wait(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.script(monkeypatch, [lambda n=n, i=i: world.upload(n, i) for n in (1, 2) for i in (0, 1)])
    result = run("federation", "wait", "-f", str(world.fid), "--interval", "1", "--eval-wait", "5", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "completed"
    assert "not every active client had reported its evaluation after 5 s" in result.output
