"""Secure aggregation's coordinator rules with literal inputs: the round plan, when a stage is over or
fails, the checks of posted keys, envelopes, shares and masked metadata, the round's record, and the
spec's refusals."""

from __future__ import annotations

import base64

import pytest
from fedprompt.coordinator.dashboard.view import timeline
from fedprompt.coordinator.errors import Invalid
from fedprompt.coordinator.logic import secagg as rules
from fedprompt.shared.secagg import shares
from fedprompt.shared.spec import FederationSpec, SecureAggregationSpec
from pydantic import ValidationError

SA = SecureAggregationSpec()


def test_plan_numbers_clients_by_id_and_draws_a_regular_graph() -> None:
    plan = rules.plan([42, 7, 19, 3, 11], SA, [0, 1, 1])
    assert plan.indices == {3: 1, 7: 2, 11: 3, 19: 4, 42: 5}
    assert plan.k == 4 and plan.t == 3  # n = 5: complete graph, t = floor(0.5·4) + 1
    assert rules.Plan.from_json(plan.as_json()) == plan
    big = rules.plan(list(range(1, 101)), SA, [0, 1, 1])
    assert big.k == 14 and big.t == 8
    assert all(len(p) == 14 for p in big.neighbours.values())
    fixed = rules.plan(list(range(1, 21)), SecureAggregationSpec(neighbours=4, threshold=0.7), [0])
    assert fixed.k == 4 and fixed.t == 3


def test_stage_outcome_waits_moves_on_and_fails() -> None:
    assert (
        rules.stage_outcome("keys", {1, 2, 3}, {1, 2}, deadline_passed=False, t=2, quorum=1).action == "wait"
    )
    done = rules.stage_outcome("keys", {1, 2, 3}, {1, 2, 3}, deadline_passed=False, t=2, quorum=1)
    assert done.action == "next" and done.survivors == {1, 2, 3}
    late = rules.stage_outcome("shares", {1, 2, 3}, {1, 2, 9}, deadline_passed=True, t=2, quorum=1)
    assert late.action == "next" and late.survivors == {1, 2}
    failed = rules.stage_outcome("shares", {1, 2, 3}, {1}, deadline_passed=True, t=2, quorum=1)
    assert failed.action == "fail"
    assert failed.reason == (
        "secure aggregation: 1 of 3 client(s) completed the shares stage, below the threshold of 2"
    )
    quorum = rules.stage_outcome("masked", {1, 2, 3, 4}, {1, 2}, deadline_passed=True, t=2, quorum=3)
    assert quorum.action == "fail" and "quorum and threshold of 3" in quorum.reason


def test_needed_and_missing_secrets() -> None:
    needed = rules.needed_secrets({1, 2}, {3: [1], 4: []})
    assert needed == {1: "seed", 2: "seed", 3: "key"}
    assert rules.missing_shares(needed, {1: {2: 5, 3: 6}, 2: {1: 5}, 3: {1: 1, 2: 2}}, 2) == [2]


def test_parse_posts() -> None:
    key = base64.b64encode(bytes(32)).decode()
    good = {"encryption_key": key, "mask_key": key, "seed_commitment": "a" * 64}
    assert rules.parse_keys(good) == good
    for bad in ({**good, "extra": 1}, {**good, "mask_key": "x"}, {**good, "seed_commitment": "z" * 64}, [1]):
        with pytest.raises(Invalid):
            rules.parse_keys(bad)
    envelope = base64.b64encode(bytes(shares.ENVELOPE_BYTES)).decode()
    assert rules.parse_envelopes({"envelopes": {"2": envelope, "5": envelope}}, [2, 5]).keys() == {2, 5}
    with pytest.raises(Invalid, match="exactly the neighbours"):
        rules.parse_envelopes({"envelopes": {"2": envelope}}, [2, 5])
    with pytest.raises(Invalid, match="bytes"):
        rules.parse_envelopes({"envelopes": {"2": key}}, [2])
    share = base64.b64encode((7).to_bytes(66, "big")).decode()
    got = rules.parse_reveal({"shares": {"1": {"kind": "seed", "share": share}}}, {1}, {2})
    assert got == {1: {"kind": "seed", "share": 7}}
    with pytest.raises(Invalid, match="no key share"):
        rules.parse_reveal({"shares": {"1": {"kind": "key", "share": share}}}, {1}, {2})
    with pytest.raises(Invalid, match="malformed"):
        rules.parse_reveal({"shares": {"1": "x"}}, {1}, set())


def test_masked_metadata_is_bound_to_round_attempt_and_client() -> None:
    meta = {"format": "fedprompt-secagg/1", "round": "2", "attempt": "1", "index": "4", "weight": "30"}
    assert rules.masked_metadata(meta, 2, 1, 4) == (30, {})
    with pytest.raises(Invalid, match="attempt '1', not 2"):
        rules.masked_metadata(meta, 2, 2, 4)
    with pytest.raises(Invalid, match="index"):
        rules.masked_metadata(meta, 2, 1, 5)
    with pytest.raises(Invalid, match="weight"):
        rules.masked_metadata({**meta, "weight": "0"}, 2, 1, 4)


def test_round_record_says_who_dropped_where() -> None:
    plan = rules.Plan(
        {10: 1, 20: 2, 30: 3, 40: 4}, {1: [2, 3, 4], 2: [1, 3, 4], 3: [1, 2, 4], 4: [1, 2, 3]}, 3, 2
    )
    reached = {"keys": [1, 2, 3, 4], "shares": [1, 2, 3], "masked": [1, 2], "unmask": [1, 2]}
    record = rules.round_record(SA, plan, reached)
    assert record["dropped_at"] == {"40": "shares", "30": "masked"}
    assert record["completed"]["masked"] == [10, 20]
    assert record["error_bound"] == 1.0 / (2**20 - 1)


def test_spec_refuses_robust_rules_and_too_few_clients_and_states_guarantees() -> None:
    with pytest.raises(ValidationError, match="robust rule needs each update"):
        FederationSpec(min_clients=3, secure_aggregation={}, aggregation={"name": "krum", "params": {"f": 1}})
    with pytest.raises(ValidationError, match="min_clients of at least 3"):
        FederationSpec(min_clients=2, quorum=1, secure_aggregation={})
    both = FederationSpec(
        min_clients=3, secure_aggregation={}, privacy={"mechanism": "laplace", "epsilon": 1.0, "clip": 1.0}
    )
    said = rules.guarantees(both)
    assert set(said) == {"local_dp", "secure_aggregation"}
    assert "ε = 1.0-DP" in said["local_dp"] and "sum of the clients' noise" in said["secure_aggregation"]


def test_timeline_shows_the_stage_and_who_dropped_where() -> None:
    base = {"participants": [], "opened_at": 0.0, "state": "open", "attempt": 1}
    running = {
        **base,
        "round": 2,
        "closed_at": None,
        "secure_aggregation": {
            "stage": "shares",
            "completed": {"keys": [1, 2, 3]},
            "dropped_at": {"4": "keys"},
        },
    }
    closed = {
        **base,
        "round": 1,
        "state": "closed",
        "closed_at": 5.0,
        "stats": {
            "secure_aggregation": {
                "completed": {"masked": [1, 2, 3]},
                "dropped_at": {"12": "unmask", "4": "shares"},
            }
        },
    }
    rows = timeline([closed, running], quorum=1, now=10.0)
    assert rows[0]["secure"] == {"stage": "shares", "survivors": None, "dropped": [("4", "keys")]}
    assert rows[1]["secure"] == {
        "stage": None,
        "survivors": 3,
        "dropped": [("4", "shares"), ("12", "unmask")],
    }
    assert timeline([{**closed, "stats": {}}], quorum=1, now=10.0)[0]["secure"] is None
