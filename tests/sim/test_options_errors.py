"""simulate's option errors, word for word: each names the option and the value the user gave, and the
secure-aggregation rule is the spec's (shared/spec.py check_secure_aggregation) in the options' names."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fedprompt.sim.options import SimulateOptions, check_attack_options, check_method_options
from fedprompt.sim.simulate import simulate_command


def _options(**over: Any) -> SimulateOptions:
    """simulate's options as the command's defaults would make them, with `over` changed."""
    params = inspect.signature(simulate_command).parameters
    return SimulateOptions(**({name: p.default for name, p in params.items()} | over))


def _error(**over: Any) -> str:
    with pytest.raises(ValueError) as exc:
        check_attack_options(_options(**over))
    return str(exc.value)


def test_a_bad_server_optimizer_names_its_option_and_the_users_value() -> None:
    assert _error(server_optimizer="fedadam:lr") == (
        "--server-optimizer 'fedadam:lr': parameters are key=value, e.g. fedadam:lr=0.1"
    )
    assert _error(server_optimizer="sgd:lr=1") == (
        "--server-optimizer 'sgd:lr=1': Input should be 'fedavg', 'fedavgm', 'fedadagrad', 'fedadam' or 'fedyogi'"
    )
    assert _error(server_optimizer="fedavgm:beta2=0.5") == (
        "--server-optimizer 'fedavgm:beta2=0.5': Value error, fedavgm takes ['lr', 'momentum'], not ['beta2']"
    )
    assert _error(server_optimizer=":lr=1") == "--server-optimizer needs a name, e.g. fedadam:lr=0.1"


def test_secure_aggregation_needs_fedavg_and_three_clients() -> None:
    assert _error(secure_aggregation=True, aggregation="median") == (
        "--secure-aggregation cannot be combined with --aggregation median: the coordinator sees only the "
        "sum of the masked updates, and a robust rule needs each update; use fedavg (optionally with a "
        "server optimiser) or drop --secure-aggregation"
    )
    assert _error(secure_aggregation=True, clients=2) == (
        "--secure-aggregation needs --clients of at least 3: with two clients each could subtract its own "
        "update from the mean and learn the other's"
    )
    check_attack_options(_options(secure_aggregation=True, clients=3))


def test_method_options_name_the_vocabularys_choices() -> None:
    with pytest.raises(ValueError) as exc:
        check_method_options(_options(scoring="mlm"))
    assert str(exc.value) == "--scoring must be auto, tied-embeddings or mean-pool; got 'mlm'"
    with pytest.raises(ValueError) as exc:
        check_method_options(_options(encoder_type="gru"))
    assert str(exc.value) == (
        "--method must be one of prompt_tuning, p_tuning, prefix_tuning and --encoder-type mlp or lstm "
        "(got 'prompt_tuning', 'gru')"
    )
