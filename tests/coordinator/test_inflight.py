"""The caps on request bodies in progress (coordinator/hosting/inflight.py), with literal sizes."""

from __future__ import annotations

import pytest
from fedprompt.coordinator.hosting.inflight import UploadGate
from fedprompt.coordinator.hosting.ratelimit import RateLimited


def test_each_holder_has_its_own_count_and_bytes() -> None:
    gate = UploadGate(2, 100)
    a1, a2 = gate.open(1), gate.open(1)
    with pytest.raises(RateLimited, match="client 1 has 2 uploads in progress"):
        gate.open(1)
    a1.add(60)
    with pytest.raises(RateLimited, match="client 1 has 101 bytes"):
        a2.add(41)
    b = gate.open(2)
    b.add(100)  # another holder's allowance is its own
    assert gate.held(1) == (2, 60) and gate.held(2) == (1, 100)
    a1.close()
    a1.close()  # idempotent
    assert gate.held(1) == (1, 0)


def test_all_holders_together_stay_within_the_process_budget() -> None:
    gate = UploadGate(2, 100, max_total_bytes=250)
    tickets = [gate.open(holder) for holder in (1, 2, 3)]
    tickets[0].add(100)
    tickets[1].add(100)
    with pytest.raises(RateLimited, match="holds 200 bytes .* 60 more would pass its 250") as refused:
        tickets[2].add(60)
    assert refused.value.headers["Retry-After"] == "1"
    assert gate.total_bytes == 200 and gate.held(3) == (1, 0)  # the refused bytes were not counted
    tickets[2].add(50)
    assert gate.total_bytes == 250
    tickets[0].close()
    assert gate.total_bytes == 150
    tickets[2].add(50)  # room again once an upload is done
    assert gate.total_bytes == 200
    for ticket in tickets:
        ticket.close()
    assert gate.total_bytes == 0


def test_without_a_process_budget_only_the_holders_caps_apply() -> None:
    gate = UploadGate(1, 10**9)
    for holder in range(50):
        gate.open(holder).add(10**8)
    assert gate.total_bytes == 50 * 10**8
