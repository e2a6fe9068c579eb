"""Secure aggregation's coordinator rules with literal inputs: the round plan, when a stage is over or
fails, the checks of posted keys, envelopes, shares and masked metadata, the round's record, and the
spec's refusals."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from fedprompt.coordinator.dashboard.view import timeline
from fedprompt.coordinator.errors import Conflict, Invalid
from fedprompt.coordinator.logic import secagg as rules
from fedprompt.shared.secagg import shares, signing
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import SecureAggregationSpec
from pydantic import ValidationError

SA = SecureAggregationSpec()


def test_plan_numbers_clients_by_id_and_draws_the_graph_from_the_roster() -> None:
    plan = rules.plan([42, 7, 19, 3, 11])
    assert plan.indices == {3: 1, 7: 2, 11: 3, 19: 4, 42: 5}
    assert plan.neighbours == {} and plan.seed == ""  # no graph before the roster of keys
    rule = Policy(min_clients=3)
    roster = {1: "a" * 64, 2: "b" * 64, 4: "c" * 64, 5: "d" * 64}  # number 3 sent no keys
    drawn = rules.graph_plan(plan, roster, rule, b"ctx")
    assert drawn.k == 3 and drawn.t == 2  # m = 4: complete graph, t = floor(0.5·3) + 1
    assert drawn.neighbours == {1: [2, 4, 5], 2: [1, 4, 5], 4: [1, 2, 5], 5: [1, 2, 4]}
    assert drawn.seed == signing.roster_seed(b"ctx", roster).hex()
    assert rules.Plan.from_json(drawn.as_json()) == drawn
    big = rules.graph_plan(
        rules.plan(list(range(1, 101))), {i: f"{i:064x}" for i in range(1, 101)}, rule, b"c"
    )
    assert big.k == 36 and big.t == 19
    assert all(len(p) == 36 for p in big.neighbours.values())
    other = rules.graph_plan(
        rules.plan(list(range(1, 101))), {i: f"{i + 1:064x}" for i in range(1, 101)}, rule, b"c"
    )
    assert other.neighbours != big.neighbours  # another roster, another graph
    fixed = rules.graph_plan(
        rules.plan(list(range(1, 21))), {i: "0" * 64 for i in range(1, 21)}, Policy(0.7, 4, 3), b"c"
    )
    assert fixed.k == 4 and fixed.t == 3


def test_stage_outcome_waits_moves_on_and_fails() -> None:
    kw = {"t": 2, "quorum": 1, "floor": 2}
    assert rules.stage_outcome("keys", {1, 2, 3}, {1, 2}, deadline_passed=False, **kw).action == "wait"
    done = rules.stage_outcome("keys", {1, 2, 3}, {1, 2, 3}, deadline_passed=False, **kw)
    assert done.action == "next" and done.survivors == {1, 2, 3}
    late = rules.stage_outcome("shares", {1, 2, 3}, {1, 2, 9}, deadline_passed=True, **kw)
    assert late.action == "next" and late.survivors == {1, 2}
    failed = rules.stage_outcome("shares", {1, 2, 3}, {1}, deadline_passed=True, **kw)
    assert failed.action == "fail"
    assert failed.reason == (
        "secure aggregation: 1 of 3 client(s) completed the shares stage, below the threshold and minimum "
        "of clients of 2"
    )
    quorum = rules.stage_outcome("masked", {1, 2, 3, 4}, {1, 2}, deadline_passed=True, t=2, quorum=3, floor=2)
    assert quorum.action == "fail" and "of 3" in quorum.reason


def test_a_round_never_goes_on_with_fewer_than_its_floor() -> None:
    # n = 3, t = 2, quorum 1: two survivors would each learn the other's update from the mean
    two = rules.stage_outcome("masked", {1, 2, 3}, {1, 2}, deadline_passed=True, t=2, quorum=1, floor=3)
    assert two.action == "fail" and "of 3" in two.reason
    for stage in ("keys", "shares", "consistency", "unmask"):
        assert (
            rules.stage_outcome(stage, {1, 2, 3}, {1, 2}, deadline_passed=True, t=2, quorum=1, floor=3).action
            == "fail"
        )
    assert Policy(min_clients=2).min_survivors == 3 and Policy(min_clients=7).min_survivors == 7


def test_sum_outside_clipping() -> None:
    top = 2**8 - 1
    assert rules.sum_outside_clipping(np.array([0, 3 * top], np.uint64), 3, 8) == (0, float(top))
    count, worst = rules.sum_outside_clipping(np.array([0, 3 * top + 1, 2**63], np.uint64), 3, 8)
    assert count == 2 and worst == 2**63 / 3
    # a weight total whose bound passes 2^64 caps at the ring
    assert rules.sum_outside_clipping(np.array([2**64 - 1], np.uint64), 2**60, 8)[0] == 0


def test_needed_and_missing_secrets() -> None:
    needed = rules.needed_secrets({1, 2}, {3: [1], 4: []})
    assert needed == {1: "seed", 2: "seed", 3: "key"}
    assert rules.missing_shares(needed, {1: {2: 5, 3: 6}, 2: {1: 5}, 3: {1: 1, 2: 2}}, 2) == [2]


def test_parse_posts() -> None:
    key = base64.b64encode(bytes(32)).decode()
    own = signing.new_signing_key()
    public = base64.b64encode(signing.public_key(own)).decode()
    advert = {"encryption_key": key, "mask_key": key, "seed_commitment": "a" * 64, "signing_key": public}
    good = {
        **advert,
        "signature": base64.b64encode(signing.sign(own, signing.keys_message(b"c", 2, 7, advert))).decode(),
    }
    assert rules.parse_keys(good, b"c", 2, 7, None) == good
    assert rules.parse_keys(good, b"c", 2, 7, public) == good
    for bad in ({**good, "extra": 1}, {**good, "mask_key": "x"}, {**good, "seed_commitment": "z" * 64}, [1]):
        with pytest.raises(Invalid):
            rules.parse_keys(bad, b"c", 2, 7, None)
    with pytest.raises(Invalid, match="signature"):  # signed for another number, client or round
        rules.parse_keys(good, b"c", 3, 7, None)
    with pytest.raises(Invalid, match="signature"):
        rules.parse_keys(good, b"c", 2, 8, None)
    with pytest.raises(Invalid, match="signature"):
        rules.parse_keys({**good, "mask_key": base64.b64encode(bytes([1]) * 32).decode()}, b"c", 2, 7, None)
    with pytest.raises(Conflict, match="cannot be replaced"):
        rules.parse_keys(good, b"c", 2, 7, key)
    message = signing.consistency_message(b"c", b"s", [1, 2, 3])
    sig = base64.b64encode(signing.sign(own, message)).decode()
    assert rules.parse_consistency({"signature": sig}, public, message) == sig
    with pytest.raises(Invalid, match="survivor set"):
        rules.parse_consistency({"signature": sig}, public, signing.consistency_message(b"c", b"s", [1, 2]))
    with pytest.raises(Invalid):
        rules.parse_consistency({"signature": "x"}, public, message)
    envelope = base64.b64encode(bytes(shares.ENVELOPE_BYTES)).decode()
    assert rules.parse_envelopes({"envelopes": {"2": envelope, "5": envelope}}, [2, 5]).keys() == {2, 5}
    with pytest.raises(Invalid, match="exactly the neighbours"):
        rules.parse_envelopes({"envelopes": {"2": envelope}}, [2, 5])
    with pytest.raises(Invalid, match="bytes"):
        rules.parse_envelopes({"envelopes": {"2": key}}, [2])
    share = base64.b64encode((7).to_bytes(66, "big")).decode()
    both = {"1": {"kind": "seed", "share": share}, "2": {"kind": "key", "share": share}}
    got = rules.parse_reveal({"shares": both}, {1}, {2})
    assert got == {1: {"kind": "seed", "share": 7}, 2: {"kind": "key", "share": 7}}
    with pytest.raises(Invalid, match="no key share"):
        rules.parse_reveal({"shares": {**both, "1": {"kind": "key", "share": share}}}, {1}, {2})
    # an answer is stored once: a partial or an empty one would block the complete one
    with pytest.raises(Invalid, match=r"lacks the shares of client numbers \[2\]"):
        rules.parse_reveal({"shares": {"1": both["1"]}}, {1}, {2})
    with pytest.raises(Invalid, match=r"lacks the shares of client numbers \[1, 2\]"):
        rules.parse_reveal({"shares": {}}, {1}, {2})
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
    reached = {"keys": [1, 2, 3, 4], "shares": [1, 2, 3], "masked": [1, 2], "consistency": [1], "unmask": [1]}
    record = rules.round_record(SA, plan, reached)
    assert record["dropped_at"] == {"40": "shares", "30": "masked", "20": "consistency"}
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
    rows = timeline([closed, running], quorum=1, now=10.0, names={4: "bodø"})
    assert rows[0]["secure"] == {
        "stage": "shares",
        "deadline_at": None,
        "stages": [("keys", 3)],
        "survivors": None,
        "dropped": [("bodø", "keys")],
    }
    assert rows[1]["secure"] == {
        "stage": None,
        "deadline_at": None,
        "stages": [("masked", 3)],
        "survivors": 3,
        "dropped": [("bodø", "shares"), ("client 12", "unmask")],  # a name where one is known
    }
    assert timeline([{**closed, "stats": {}}], quorum=1, now=10.0)[0]["secure"] is None
