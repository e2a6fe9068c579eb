"""Progress in a log: the training clients' local steps from their heartbeats, as one plain line."""

from __future__ import annotations

from fedprompt.sim.progress import training_line


def test_training_line_sums_the_steps_of_the_clients_training_in_the_round() -> None:
    clients = [
        {"activity": {"phase": "training", "round": 2, "step": 40, "total_steps": 100}},
        {"activity": {"phase": "training", "round": 2, "step": 35, "total_steps": 100}},
        {"activity": {"phase": "idle", "round": 2}},  # done with its round
        {"activity": {"phase": "training", "round": 1, "step": 100, "total_steps": 100}},  # an old heartbeat
        {"activity": None},  # never sent one
        {"activity": {"phase": "training", "round": 2, "step": 0, "total_steps": 0}},  # not counted yet
    ]
    assert training_line(clients, 2) == "round 2: 2 clients training, local steps 75/200"
    assert training_line(clients, 1) == "round 1: 1 client training, local steps 100/100"
    assert training_line(clients, 3) is None
