"""The vocabulary's registered sets: the server optimisers the spec takes are the ones with an update rule
and ServerOptimizer's members; the aggregation rules are AggregationRule's; the API's Literals are
built from the members. A new server optimiser is its name and defaults in one shared place and its
rule in coordinator/logic/server_optim.py: the toy one below is added in exactly those two places,
validates in a spec and is applied by the coordinator."""

from __future__ import annotations

from typing import Any, get_args

import numpy as np
import pytest
from fedprompt.coordinator.api import schemas
from fedprompt.coordinator.logic import aggregation, robust, server_optim
from fedprompt.coordinator.logic.round_states import STAGES
from fedprompt.coordinator.logic.specs import validate_spec
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared import vocab, wire
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import ServerOptimizerSpec
from fedprompt.shared.vocab import (
    SERVER_OPTIMIZER_DEFAULTS,
    AggregationRule,
    FederationState,
    RoundState,
    SecureStage,
    ServerOptimizer,
    TaskKind,
)

from tests.helpers import SMALL_SPEC, update_blob


def test_the_specs_optimisers_are_the_registrys_and_the_vocabularys() -> None:
    schema = ServerOptimizerSpec.model_json_schema()
    in_schema = schema["$defs"][schema["properties"]["name"]["$ref"].rsplit("/", 1)[-1]]["enum"]
    assert set(SERVER_OPTIMIZER_DEFAULTS) == set(server_optim.available_optimizers()) == set(ServerOptimizer)
    assert in_schema == [m.value for m in ServerOptimizer] == list(SERVER_OPTIMIZER_DEFAULTS)
    for name, defaults in SERVER_OPTIMIZER_DEFAULTS.items():  # each rule takes its row's hyper-parameters
        assert sorted(server_optim.hyperparameters(name)) == sorted(defaults), name


def test_the_aggregation_rules_are_the_vocabularys() -> None:
    assert robust.median is not None  # robust.py registers its rules on import
    assert set(aggregation.available_rules()) == set(AggregationRule)


def test_fedavg_as_a_server_optimiser_is_the_average() -> None:
    x = {"p": np.zeros(3, np.float32)}
    average = {"p": np.array([0.1, -0.2, 0.3], np.float32)}
    step = server_optim.server_step(ServerOptimizer.FEDAVG, x, average, {}, {})
    assert np.array_equal(step.tensors["p"], average["p"]) and step.step == 1


@pytest.fixture
def fedsgd(monkeypatch: pytest.MonkeyPatch) -> None:
    """A toy server optimiser, x += lr·Δ, added where a real one would be: its name and defaults in
    SERVER_OPTIMIZER_DEFAULTS (shared/vocab.py), its update rule registered in server_optim."""
    monkeypatch.setitem(vocab.SERVER_OPTIMIZER_DEFAULTS, "fedsgd", {"lr": 1.0})
    monkeypatch.setattr(server_optim, "_OPTIMIZERS", dict(server_optim._OPTIMIZERS))

    @server_optim.register("fedsgd")
    def _fedsgd(x: Any, average: Any, state: Any, *, lr: float) -> server_optim.ServerStep:
        delta, _, t = server_optim._prepare(x, average, state, ())
        moved = {name: np.asarray(x[name], np.float64) + lr * d for name, d in delta.items()}
        return server_optim._finish(x, moved, {}, t)


@pytest.mark.usefixtures("fedsgd")
def test_a_server_optimiser_added_in_two_places_validates_and_applies() -> None:
    spec = validate_spec({**SMALL_SPEC, "server_optimizer": {"name": "fedsgd", "lr": 0.5}})
    assert spec.server_optimizer is not None and spec.server_optimizer.params() == {"lr": 0.5}
    assert FederationSpec.model_validate({**SMALL_SPEC, "server_optimizer": {"name": "fedsgd"}}).server_optimizer.params() == {"lr": 1.0}  # fmt: skip
    with pytest.raises(ValueError, match=r"fedsgd takes \['lr'\], not \['momentum'\]"):
        ServerOptimizerSpec.model_validate({"name": "fedsgd", "momentum": 0.9})
    x = {"p": np.array([1.0, 2.0], np.float32)}
    step = server_optim.server_step("fedsgd", x, {"p": np.array([3.0, 0.0], np.float32)}, {}, {"lr": 0.5})
    assert step.tensors["p"].tolist() == [2.0, 1.0]


@pytest.mark.usefixtures("fedsgd")
def test_the_coordinator_steps_a_round_with_the_added_optimiser(service: Coordinator) -> None:
    spec = FederationSpec.model_validate({**SMALL_SPEC, "server_optimizer": {"name": "fedsgd", "lr": 0.5}})
    fid = service.federations.create_federation(spec).id
    token, _ = service.enrolment.create_enrollment_token(fid)
    clients = [
        service.enrolment.enroll(fid, token, name=f"c{i}", num_samples=30, info={})[0] for i in range(2)
    ]
    x0 = wire.decode(service.tasks.get_prompt(fid, 0).blob)[0]["prompt_embeddings"].astype(np.float64)
    blobs = [update_blob(spec, seed, num_samples=10, base_version=0) for seed in (1, 2)]
    for client, blob in zip(clients, blobs, strict=True):
        assert service.uploads.upload(fid, 1, client, blob).created
    service.cycle.after_upload(fid)
    average = np.mean([wire.decode(b)[0]["prompt_embeddings"].astype(np.float64) for b in blobs], axis=0)
    x1 = wire.decode(service.tasks.get_prompt(fid, 1).blob)[0]["prompt_embeddings"]
    np.testing.assert_allclose(x1, x0 + 0.5 * (average.astype(np.float32) - x0), rtol=0, atol=1e-6)
    (round_1,) = [r for r in service.reads.rounds(fid) if r["round"] == 1]
    assert round_1["stats"]["server_optimizer"]["name"] == "fedsgd"


def test_the_apis_literals_are_built_from_the_vocabulary() -> None:
    assert set(get_args(schemas.FederationStateName)) == set(FederationState)
    assert set(get_args(schemas.TaskKindName)) == set(TaskKind)
    assert set(get_args(schemas.RoundStateShown)) == set(RoundState) - {RoundState.AGGREGATING}
    assert set(get_args(schemas.SecaggTaskStage)) == set(STAGES) - {SecureStage.MASKED}
