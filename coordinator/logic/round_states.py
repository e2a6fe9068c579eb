"""The life of a round, a secure round's stages and a federation, as transition tables. No I/O.

Every change of Round.state, SecaggRound.stage and Federation.state goes through `round_after`,
`stage_after` and `federation_after` (coordinator/usecases/rounds.py and secagg.py), which look the
(state, event) pair up in its table and refuse one that is not there (TransitionError).

A round is created open (ROUND_START) and then, within the transaction that locks its federation:

    open --aggregate--> aggregating --close--> closed
    open --fail-------> failed                           (below the quorum at the deadline, a secure
                                                          stage that failed)
    aggregating --fail--> failed                         (secure rounds only: shares that do not
                                                          reconstruct, an unmasked sum outside clipping)

A plain round whose aggregation fails is not failed: its transaction is rolled back (409), open.
A secure round's stages (docs/secure-aggregation.md) go keys → shares → masked → consistency →
unmask → done, one stage on each `complete`; any of the five stages may `fail`.

A federation is created waiting (FEDERATION_START). While no round is open it is waiting or paused,
and opening a round makes it running; the round's end (closed or failed) makes it waiting again, its
last round's close completed, which it stays:

    waiting | paused --open_round--> running --end_round--> waiting
    waiting | paused --wait--> waiting        (too few clients available, or auto_advance off)
    waiting | paused --pause--> paused        (the operator paused it: no round opens by itself)
    waiting | paused | running --complete--> completed
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from fedprompt.shared.vocab import FederationState, RoundState, SecureStage


class TransitionError(RuntimeError):
    """A change of state that its table does not allow: a bug, never a client's mistake."""


class RoundEvent(StrEnum):
    """What happens to a round."""

    AGGREGATE = "aggregate"  # its updates are in (all, the quorum at the deadline, or unmasked)
    CLOSE = "close"  # its aggregate is stored as the next prompt version
    FAIL = "fail"  # it cannot be aggregated; the round is retried as a new attempt


class StageEvent(StrEnum):
    """What happens to a secure round's stage."""

    COMPLETE = "complete"  # enough clients answered, in time
    FAIL = "fail"  # too few answered, or the unmasking cannot reconstruct the sum's secrets


class FederationEvent(StrEnum):
    """What happens to a federation."""

    OPEN_ROUND = "open_round"  # a round opened
    END_ROUND = "end_round"  # its round closed or failed, and rounds remain
    WAIT = "wait"  # no round could open: too few clients available, or auto_advance off
    PAUSE = "pause"  # no round opens automatically while the operator has paused it
    COMPLETE = "complete"  # its last round closed (or none is left to open)


ROUND_START = RoundState.OPEN

# (state, event) -> next state of a plain round
PLAIN_ROUND: dict[tuple[RoundState, RoundEvent], RoundState] = {
    (RoundState.OPEN, RoundEvent.AGGREGATE): RoundState.AGGREGATING,
    (RoundState.AGGREGATING, RoundEvent.CLOSE): RoundState.CLOSED,
    (RoundState.OPEN, RoundEvent.FAIL): RoundState.FAILED,
}
# a secure round's aggregation (the unmasking) can also fail the round
SECURE_ROUND: dict[tuple[RoundState, RoundEvent], RoundState] = {
    **PLAIN_ROUND,
    (RoundState.AGGREGATING, RoundEvent.FAIL): RoundState.FAILED,
}

STAGE_START = SecureStage.KEYS
# the stages in their order, each one's clients answering (then DONE, or FAILED)
STAGES: tuple[SecureStage, ...] = (
    SecureStage.KEYS,
    SecureStage.SHARES,
    SecureStage.MASKED,
    SecureStage.CONSISTENCY,
    SecureStage.UNMASK,
)
SECURE_STAGES: dict[tuple[SecureStage, StageEvent], SecureStage] = {
    **{
        (stage, StageEvent.COMPLETE): after
        for stage, after in zip(STAGES, (*STAGES[1:], SecureStage.DONE), strict=True)
    },
    **{(stage, StageEvent.FAIL): SecureStage.FAILED for stage in STAGES},
}

FEDERATION_START = FederationState.WAITING
_IDLE = (FederationState.WAITING, FederationState.PAUSED)  # no round open
FEDERATION: dict[tuple[FederationState, FederationEvent], FederationState] = {
    **{(state, FederationEvent.OPEN_ROUND): FederationState.RUNNING for state in _IDLE},
    (FederationState.RUNNING, FederationEvent.END_ROUND): FederationState.WAITING,
    **{(state, FederationEvent.WAIT): FederationState.WAITING for state in _IDLE},
    **{(state, FederationEvent.PAUSE): FederationState.PAUSED for state in _IDLE},
    **{
        (state, FederationEvent.COMPLETE): FederationState.COMPLETED
        for state in (*_IDLE, FederationState.RUNNING)
    },
}


S = TypeVar("S", bound=StrEnum)
V = TypeVar("V", bound=StrEnum)


def _after(table: dict[tuple[S, V], S], kind: type[S], state: str, event: V, what: str) -> S:
    try:
        return table[(kind(state), event)]
    except (KeyError, ValueError):
        allowed = sorted(e.value for s, e in table if s == state)
        raise TransitionError(
            f"{what} '{state}' cannot {event.value}"
            + (f" (it can: {', '.join(allowed)})" if allowed else " (nothing leaves it)")
        ) from None


def round_after(state: str, event: RoundEvent, *, secure: bool) -> RoundState:
    """A round's state after `event`; TransitionError if its table (secure or plain) has no such move."""
    table = SECURE_ROUND if secure else PLAIN_ROUND
    return _after(
        table, RoundState, state, event, "a secure round in state" if secure else "a round in state"
    )


def stage_after(stage: str, event: StageEvent) -> SecureStage:
    """A secure round's stage after `event`; TransitionError if the stage table has no such move."""
    return _after(SECURE_STAGES, SecureStage, stage, event, "a secure round in stage")


def federation_after(state: str, event: FederationEvent) -> FederationState:
    """A federation's state after `event`; TransitionError if the federation table has no such move."""
    return _after(FEDERATION, FederationState, state, event, "a federation in state")
