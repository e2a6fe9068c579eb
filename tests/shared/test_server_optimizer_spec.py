"""The federation spec's server_optimizer: defaults per optimiser, and settings that cannot work refused
with a message that names the field."""

from __future__ import annotations

from typing import Any

import pytest
from fedprompt.coordinator.errors import Invalid
from fedprompt.coordinator.logic.specs import validate_spec
from fedprompt.shared.spec import SERVER_OPTIMIZER_DEFAULTS, FederationSpec
from fedprompt.shared.spec_options import ServerOptimizerSpec


def test_default_is_no_server_optimiser() -> None:
    assert FederationSpec().server_optimizer is None
    assert FederationSpec().model_dump()["server_optimizer"] is None


@pytest.mark.parametrize(
    "name, params",
    [
        ("fedavg", {}),
        ("fedavgm", {"lr": 1.0, "momentum": 0.9}),
        ("fedadagrad", {"lr": 0.1, "beta1": 0.0, "tau": 1e-3}),
        ("fedadam", {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
        ("fedyogi", {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}),
    ],
)
def test_unset_hyper_parameters_take_the_optimisers_defaults(name: str, params: dict[str, float]) -> None:
    optimizer = ServerOptimizerSpec(name=name)  # type: ignore[arg-type]
    assert optimizer.params() == params == SERVER_OPTIMIZER_DEFAULTS[name]
    # the stored spec records the values used, and validates again to the same spec
    spec = FederationSpec(server_optimizer=optimizer)
    assert FederationSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_given_hyper_parameters_are_kept() -> None:
    optimizer = ServerOptimizerSpec.model_validate(
        {"name": "fedadam", "lr": 0.3, "tau": 1e-9, "beta2": 0.999}
    )
    assert optimizer.params() == {"lr": 0.3, "beta1": 0.9, "beta2": 0.999, "tau": 1e-9}


@pytest.mark.parametrize(
    "optimizer, message",
    [
        ({"name": "fedadam", "momentum": 0.9}, "momentum is beta1"),
        ({"name": "fedavgm", "beta1": 0.9}, "fedavgm takes ['lr', 'momentum'], not ['beta1']"),
        ({"name": "fedadagrad", "beta2": 0.99}, "plain sum"),
        ({"name": "fedavg", "lr": 1.0}, "fedavg takes no server hyper-parameters"),
        ({"name": "adam"}, "server_optimizer.name: Input should be 'fedavg', 'fedavgm'"),
        ({"lr": 0.1}, "server_optimizer.name: Field required"),
        ({"name": "fedadam", "lr": 0}, "server_optimizer.lr: Input should be greater than 0"),
        ({"name": "fedyogi", "beta2": 1.0}, "server_optimizer.beta2: Input should be less than 1"),
        ({"name": "fedavgm", "momentum": -0.1}, "server_optimizer.momentum"),
        ({"name": "fedadam", "tau": 0}, "server_optimizer.tau"),
        ({"name": "fedadam", "eta": 0.1}, "server_optimizer.eta: Extra inputs are not permitted"),
        ("fedadam", "server_optimizer: Input should be a valid dictionary"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_field(optimizer: Any, message: str) -> None:
    with pytest.raises(Invalid) as caught:
        validate_spec({"server_optimizer": optimizer})
    assert caught.value.status == 422
    assert message in caught.value.detail, caught.value.detail
