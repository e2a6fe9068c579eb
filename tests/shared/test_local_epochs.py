"""local_epochs: a client's local steps capped at E passes over its own shard (FedAvg's E)."""

from __future__ import annotations

import pytest
from fedprompt.shared.spec import FederationSpec, client_steps


@pytest.mark.parametrize(
    "local_steps, epochs, samples, batch, steps",
    [
        (100, None, 40, 16, 100),  # no cap: every client trains local_steps
        (100, 2.0, 800, 16, 100),  # 2 passes over 800 = 100 steps, the cap is not reached
        (100, 2.0, 200, 16, 25),  # 2 passes over 200 = 25 steps
        (100, 2.0, 41, 16, 6),  # ceil(82 / 16)
        (100, 0.01, 10, 16, 1),  # at least one step
        (50, 10.0, 8000, 16, 50),  # never more than local_steps
    ],
)
def test_local_epochs_cap_a_clients_steps(
    local_steps: int, epochs: float | None, samples: int, batch: int, steps: int
) -> None:
    assert client_steps(local_steps, epochs, samples, batch) == steps


def test_local_epochs_must_be_positive() -> None:
    assert FederationSpec(local_epochs=1.5).local_epochs == 1.5
    with pytest.raises(ValueError, match="local_epochs"):
        FederationSpec(local_epochs=0)
