"""The transition tables of coordinator/logic/round_states.py, row by row as written out here, and the
refusal of every move they do not hold."""

from __future__ import annotations

import itertools

import pytest
from fedprompt.coordinator.logic.round_states import (
    FEDERATION,
    FEDERATION_START,
    PLAIN_ROUND,
    ROUND_START,
    SECURE_ROUND,
    SECURE_STAGES,
    STAGE_START,
    STAGES,
    FederationEvent,
    RoundEvent,
    StageEvent,
    TransitionError,
    federation_after,
    round_after,
    stage_after,
)
from fedprompt.shared.vocab import FederationState, RoundState, SecureStage

# (state, event, next): the rows as the round cycle (coordinator/usecases/rounds.py) uses them
PLAIN_ROWS = [
    ("open", "aggregate", "aggregating"),
    ("aggregating", "close", "closed"),
    ("open", "fail", "failed"),
]
SECURE_ROWS = [*PLAIN_ROWS, ("aggregating", "fail", "failed")]  # the unmasking fails in aggregation
STAGE_ROWS = [
    ("keys", "complete", "shares"),
    ("shares", "complete", "masked"),
    ("masked", "complete", "consistency"),
    ("consistency", "complete", "unmask"),
    ("unmask", "complete", "done"),
    ("keys", "fail", "failed"),
    ("shares", "fail", "failed"),
    ("masked", "fail", "failed"),
    ("consistency", "fail", "failed"),
    ("unmask", "fail", "failed"),
]
FEDERATION_ROWS = [
    ("waiting", "open_round", "running"),
    ("paused", "open_round", "running"),
    ("running", "end_round", "waiting"),
    ("waiting", "wait", "waiting"),
    ("paused", "wait", "waiting"),
    ("waiting", "pause", "paused"),
    ("paused", "pause", "paused"),
    ("waiting", "complete", "completed"),
    ("paused", "complete", "completed"),
    ("running", "complete", "completed"),
]


def test_the_tables_are_exactly_their_rows() -> None:
    assert {(s, e): n for s, e, n in PLAIN_ROWS} == PLAIN_ROUND
    assert {(s, e): n for s, e, n in SECURE_ROWS} == SECURE_ROUND
    assert {(s, e): n for s, e, n in STAGE_ROWS} == SECURE_STAGES
    assert {(s, e): n for s, e, n in FEDERATION_ROWS} == FEDERATION
    assert (ROUND_START, STAGE_START, FEDERATION_START) == ("open", "keys", "waiting")
    assert [*STAGES] == ["keys", "shares", "masked", "consistency", "unmask"]


@pytest.mark.parametrize(("state", "event", "after"), PLAIN_ROWS)
def test_plain_round_rows(state: str, event: str, after: str) -> None:
    assert round_after(state, RoundEvent(event), secure=False) == after
    assert round_after(state, RoundEvent(event), secure=True) == after  # a secure round moves alike


@pytest.mark.parametrize(("state", "event", "after"), STAGE_ROWS)
def test_secure_stage_rows(state: str, event: str, after: str) -> None:
    assert stage_after(state, StageEvent(event)) is SecureStage(after)


@pytest.mark.parametrize(("state", "event", "after"), FEDERATION_ROWS)
def test_federation_rows(state: str, event: str, after: str) -> None:
    assert federation_after(state, FederationEvent(event)) is FederationState(after)


def test_only_a_secure_round_fails_while_aggregating() -> None:
    assert round_after(RoundState.AGGREGATING, RoundEvent.FAIL, secure=True) is RoundState.FAILED
    with pytest.raises(
        TransitionError, match=r"^a round in state 'aggregating' cannot fail \(it can: close\)$"
    ):
        round_after(RoundState.AGGREGATING, RoundEvent.FAIL, secure=False)


def test_every_move_outside_the_tables_is_refused() -> None:
    for secure, table in ((False, PLAIN_ROUND), (True, SECURE_ROUND)):
        for state, event in itertools.product(RoundState, RoundEvent):
            if (state, event) not in table:
                with pytest.raises(TransitionError):
                    round_after(state, event, secure=secure)
    for stage, event in itertools.product(SecureStage, StageEvent):
        if (stage, event) not in SECURE_STAGES:
            with pytest.raises(TransitionError):
                stage_after(stage, event)
    for state, event in itertools.product(FederationState, FederationEvent):
        if (state, event) not in FEDERATION:
            with pytest.raises(TransitionError):
                federation_after(state, event)


def test_an_illegal_move_says_what_was_asked_and_what_is_allowed() -> None:
    with pytest.raises(
        TransitionError, match=r"^a round in state 'closed' cannot aggregate \(nothing leaves it\)$"
    ):
        round_after("closed", RoundEvent.AGGREGATE, secure=False)
    with pytest.raises(
        TransitionError, match=r"^a round in state 'open' cannot close \(it can: aggregate, fail\)$"
    ):
        round_after("open", RoundEvent.CLOSE, secure=False)
    with pytest.raises(TransitionError, match=r"^a secure round in stage 'done' cannot fail"):
        stage_after("done", StageEvent.FAIL)
    with pytest.raises(TransitionError, match=r"^a federation in state 'completed' cannot open_round"):
        federation_after("completed", FederationEvent.OPEN_ROUND)
    with pytest.raises(TransitionError, match=r"^a secure round in state 'bogus' cannot fail"):
        round_after("bogus", RoundEvent.FAIL, secure=True)  # a state outside the vocabulary
