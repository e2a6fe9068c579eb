"""A site's health as the operator sees it, from when the coordinator last heard from it and what it
last said it was doing. No I/O.

A worker polls for tasks while idle and sends a heartbeat every `heartbeat_s` while it trains
(FederationSpec.heartbeat_s), so silence means trouble whatever the site is doing:

- `revoked`: the operator revoked it;
- `gone`: silent for the federation's availability_timeout_s (it is no longer selected);
- `stale`: silent for stale_after_s (three heartbeats): dead, hung or cut off, though a round may
  still wait for it until its deadline;
- `training`: its last heartbeat says it trains for the open round;
- `live`: heard from recently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SITE_STATES = ("live", "training", "stale", "gone", "revoked")
PHASES = ("training", "idle")


def site_state(
    *,
    now: float,
    last_seen_at: float,
    revoked: bool,
    activity: Mapping[str, Any] | None,
    open_round: int | None,
    stale_after_s: float,
    availability_timeout_s: float,
) -> str:
    """One of SITE_STATES."""
    if revoked:
        return "revoked"
    silent = now - last_seen_at
    if silent > availability_timeout_s:
        return "gone"
    if silent > stale_after_s:
        return "stale"
    said = activity or {}
    if said.get("phase") == "training" and open_round is not None and said.get("round") == open_round:
        return "training"
    return "live"


def count_states(states: list[str]) -> dict[str, int]:
    """Sites per state, every state present (0 where none)."""
    return {state: states.count(state) for state in SITE_STATES}
