"""Secure aggregation's rules on the coordinator's side, as pure functions: a round's plan (who is
number what, the neighbourhood graph, the threshold), when a stage is over and whether the round goes
on, the checks of what clients post, and what the round's statistics say. No I/O.

A secure round moves through five stages, each with its own deadline (docs/secure-aggregation.md):

    keys         every participant advertises its signed public keys              -> U0
    shares       U0 clients send envelopes to their neighbours in U0               -> U1
    masked       U1 clients train and upload their masked vectors                 -> U2
    consistency  U2 clients sign the survivor set U2                              -> U3
    unmask       U3 clients reveal the shares the sum of U2 needs                 -> U4

The neighbourhood graph, k and t are fixed when the keys stage closes, from the hash of the roster
of signed keys (``graph_plan``), by the same rule the clients apply (shared/secagg/client.py Policy).
A stage is over when every client expected in it has answered, or at its deadline; the round fails
when fewer than max(t, min_clients, 3) (and the quorum, for the masked vectors) remain, when the
answers of U4 cannot reconstruct every secret the sum needs, or when the unmasked sum lies outside
what clipped updates and the declared weights allow (``sum_outside_clipping``).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fedprompt.coordinator.errors import Conflict, Invalid
from fedprompt.coordinator.logic.round_states import STAGES
from fedprompt.shared.secagg import graph, protocol, quantise, shamir, shares, signing
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import SecureAggregationSpec
from fedprompt.shared.vocab import SecureStage


@dataclass(frozen=True)
class Plan:
    """A secure round's public plan: participants' numbers (client id -> 1..n), and once the keys
    stage closed, the neighbourhood graph over the numbers in the roster, k, t and the graph's seed
    (hex; empty before)."""

    indices: dict[int, int]
    neighbours: dict[int, list[int]]
    k: int
    t: int
    seed: str = ""

    def client_of(self) -> dict[int, int]:
        """Number -> client id."""
        return {i: cid for cid, i in self.indices.items()}

    def as_json(self) -> dict[str, Any]:
        """For the database (JSON keys are strings)."""
        return {
            "indices": {str(c): i for c, i in self.indices.items()},
            "neighbours": {str(i): p for i, p in self.neighbours.items()},
            "k": self.k,
            "t": self.t,
            "seed": self.seed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        """The inverse of as_json."""
        return cls(
            {int(c): int(i) for c, i in data["indices"].items()},
            {int(i): [int(p) for p in peers] for i, peers in data["neighbours"].items()},
            int(data["k"]),
            int(data["t"]),
            str(data.get("seed", "")),
        )


def policy(spec: FederationSpec) -> Policy:
    """The protocol's numbers by the rule every client applies to its own copy of the spec."""
    return Policy.from_spec(spec)


def plan(client_ids: Sequence[int]) -> Plan:
    """Number the participants by client id; the graph waits for the roster of keys."""
    ordered = sorted(client_ids)
    return Plan({cid: i + 1 for i, cid in enumerate(ordered)}, {}, 0, 0)


def graph_plan(plan_: Plan, roster: Mapping[int, str], rule: Policy, context: bytes) -> Plan:
    """The plan once the keys stage closed: the graph over the roster's numbers (number -> digest of
    the signed advertisement), drawn from the roster's hash, with k and t of the clients' rule."""
    m = len(roster)
    seed = signing.roster_seed(context, roster)
    k = rule.k(m)
    return Plan(
        plan_.indices,
        graph.relabel(graph.neighbours(m, seed, k), sorted(roster)),
        k,
        rule.t(m),
        seed.hex(),
    )


@dataclass(frozen=True)
class StageOutcome:
    """What to do with a stage: wait, move on with `survivors`, or fail the round (`reason`)."""

    action: str  # "wait" | "next" | "fail"
    survivors: frozenset[int] = frozenset()
    reason: str = ""


def stage_outcome(
    stage: str,
    expected: set[int],
    arrived: set[int],
    *,
    deadline_passed: bool,
    t: int,
    quorum: int,
    floor: int,
) -> StageOutcome:
    """Whether the stage is over (everyone expected answered, or its deadline passed), and if so
    whether enough clients remain to go on: at least max(t, floor), and at least the quorum of masked
    vectors (floor: max(min_clients, 3), below which a round never closes)."""
    answered = arrived & expected
    if answered != expected and not deadline_passed:
        return StageOutcome("wait")
    need = max(t, floor, quorum) if stage == SecureStage.MASKED else max(t, floor)
    if len(answered) < need:
        what = (
            "the quorum, threshold and minimum of clients"
            if stage == SecureStage.MASKED
            else "the threshold and minimum of clients"
        )
        return StageOutcome(
            "fail",
            reason=f"secure aggregation: {len(answered)} of {len(expected)} client(s) completed the "
            f"{stage} stage, below {what} of {need}",
        )
    return StageOutcome("next", frozenset(answered))


def recipients(plan_: Plan, index: int, advertised: set[int]) -> list[int]:
    """The neighbours a client sends envelopes to: its neighbours that advertised keys."""
    return [j for j in plan_.neighbours[index] if j in advertised]


def parse_keys(
    payload: Any, context: bytes, index: int, client_id: int, pinned: str | None
) -> dict[str, str]:
    """A client's advertisement, checked (422 if malformed or not signed by its signing key; 409 if
    that key is not the one pinned to the client)."""
    if not isinstance(payload, dict) or set(payload) != set(signing.ADVERT_FIELDS):
        raise Invalid(f"keys must be an object with exactly {', '.join(signing.ADVERT_FIELDS)}")
    advert = {k: str(v) for k, v in payload.items()}
    try:
        protocol.PeerKeys.from_json(advert)
        public = protocol.unb64(advert["signing_key"], signing.PUBLIC_BYTES)
        signature = protocol.unb64(advert["signature"], signing.SIGNATURE_BYTES)
    except protocol.ProtocolError as exc:
        raise Invalid(f"keys: {exc}") from None
    if pinned is not None and pinned != advert["signing_key"]:
        raise Conflict(
            f"client {client_id} registered another signing key; a client's signing key cannot be replaced "
            "(enrol a new client for a new key)"
        )
    if not signing.verify(public, signing.keys_message(context, index, client_id, advert), signature):
        raise Invalid(
            f"keys: the signature is not signing_key's signature of this round's keys for number {index}, "
            f"client {client_id}"
        )
    return advert


def parse_consistency(payload: Any, signing_key: str, message: bytes) -> str:
    """A client's signature of the survivor set (422 unless its signing key's signature of `message`)."""
    if not isinstance(payload, dict) or set(payload) != {"signature"}:
        raise Invalid(
            "consistency must be an object {'signature': base64 Ed25519 signature of the survivors}"
        )
    try:
        raw = protocol.unb64(str(payload["signature"]), signing.SIGNATURE_BYTES)
    except protocol.ProtocolError as exc:
        raise Invalid(f"consistency: {exc}") from None
    if not signing.verify(protocol.unb64(signing_key, signing.PUBLIC_BYTES), message, raw):
        raise Invalid("consistency: the signature is not this client's signature of the round's survivor set")
    return str(payload["signature"])


def sum_outside_clipping(total: np.ndarray, weight_total: int, bits: int) -> tuple[int, float]:
    """(how many elements, the largest S/W) of an unmasked sum S beyond what clipped, quantised updates
    and a total weight W allow: S/W ≤ 2^bits − 1 per element. A non-zero count means a client uploaded
    something other than its weighted levels (or declared more weight than it used)."""
    limit = np.uint64(min(weight_total * (quantise.levels(bits) - 1), (1 << 64) - 1))
    values = np.asarray(total, dtype=np.uint64)
    over = values > limit
    count = int(over.sum())
    worst = float(values.max()) / weight_total if values.size and weight_total else 0.0
    return count, worst


def parse_envelopes(payload: Any, expected: Sequence[int]) -> dict[int, bytes]:
    """A client's envelopes {recipient number: base64}, exactly one per expected recipient."""
    if not isinstance(payload, dict) or not isinstance(payload.get("envelopes"), dict):
        raise Invalid("shares must be an object {'envelopes': {recipient number: base64 envelope}}")
    raw = payload["envelopes"]
    try:
        got = {int(j): base64.b64decode(str(v), validate=True) for j, v in raw.items()}
    except (ValueError, binascii.Error):
        raise Invalid("shares: recipient numbers must be integers and envelopes base64") from None
    if sorted(got) != sorted(expected):
        raise Invalid(f"shares: envelopes go to exactly the neighbours {sorted(expected)}; got {sorted(got)}")
    if any(len(v) != shares.ENVELOPE_BYTES for v in got.values()):
        raise Invalid(f"shares: an envelope is {shares.ENVELOPE_BYTES} bytes")
    return got


def parse_reveal(payload: Any, seeds_of: set[int], keys_of: set[int]) -> dict[int, dict[str, Any]]:
    """A client's unmasking answer {sender number: {kind, share}}: a seed share for a survivor, a key
    share for a dropped client, exactly for the senders it holds an envelope from (an answer is stored
    once, so a partial or empty one is refused rather than allowed to block the complete one)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("shares"), dict):
        raise Invalid("unmasking must be an object {'shares': {sender number: {kind, share}}}")
    out: dict[int, dict[str, Any]] = {}
    for key, item in payload["shares"].items():
        try:
            sender = int(key)
            kind = item["kind"]
            value = shamir.share_from_bytes(base64.b64decode(str(item["share"]), validate=True))
        except (ValueError, TypeError, KeyError, binascii.Error, shamir.ShamirError):
            raise Invalid(f"unmasking: the share of {key!r} is malformed") from None
        want = "seed" if sender in seeds_of else "key" if sender in keys_of else None
        if want is None or kind != want:
            raise Invalid(f"unmasking: no {kind} share of client number {sender} is asked for")
        out[sender] = {"kind": kind, "share": value}
    missing = sorted((seeds_of | keys_of) - set(out))
    if missing:
        raise Invalid(
            f"unmasking: the answer lacks the shares of client numbers {missing}; a client answers once, "
            "with a share for every sender asked for"
        )
    return out


def needed_secrets(survivors: set[int], dropped_included_by: Mapping[int, Sequence[int]]) -> dict[int, str]:
    """Number -> which secret of it the sum needs: the seed of a survivor, the key of a dropped client
    some survivor masked with."""
    out = {j: "seed" for j in survivors}
    out.update({j: "key" for j, by in dropped_included_by.items() if by})
    return out


def missing_shares(needed: Mapping[int, str], revealed: Mapping[int, Mapping[int, int]], t: int) -> list[int]:
    """The numbers whose needed secret has fewer than t revealed shares."""
    return sorted(j for j in needed if len(revealed.get(j, {})) < t)


def masked_metadata(
    meta: Mapping[str, str], number: int, attempt: int, index: int
) -> tuple[int, dict[str, Any]]:
    """(weight, metrics) of a masked upload's metadata, which must name this round, attempt and client
    number (a masked vector replayed into another attempt or by another client is refused)."""
    if meta.get("format") != protocol.MASKED_FORMAT:
        raise Invalid(f"metadata 'format' must be '{protocol.MASKED_FORMAT}' (got {meta.get('format')!r})")
    for key, want in (("round", number), ("attempt", attempt), ("index", index)):
        if meta.get(key) != str(want):
            raise Invalid(
                f"this masked vector was made for {key} {meta.get(key)!r}, not {want}: masks are bound to "
                "one attempt of one round and one client"
            )
    try:
        weight = int(meta.get("weight", ""))
        metrics = json.loads(meta.get("metrics", "{}"))
    except ValueError:
        raise Invalid("metadata 'weight' must be an integer and 'metrics' a JSON object") from None
    if weight < 1 or not isinstance(metrics, dict):
        raise Invalid("metadata 'weight' must be a positive integer and 'metrics' a JSON object")
    return weight, metrics


def stage_view(plan_: Plan, stage: str, reached: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """Where a secure round attempt stands, by client id: its stage, who completed each stage so far,
    and the stage each missing client did not complete."""
    client_of = plan_.client_of()
    completed = {s: sorted(client_of[i] for i in reached[s]) for s in STAGES if s in reached}
    previous = set(plan_.indices.values())
    dropped: dict[str, str] = {}
    for name in STAGES:
        if name not in reached:
            break
        now = set(reached[name])
        for i in sorted(previous - now):
            dropped[str(client_of[i])] = name
        previous = now
    return {"stage": stage, "completed": completed, "dropped_at": dropped}


def round_record(
    sa: SecureAggregationSpec, plan_: Plan, reached: Mapping[str, Sequence[int]]
) -> dict[str, Any]:
    """What the round's stats say of its secure aggregation: k, t, the bound, who completed each stage
    and who dropped where (client ids)."""
    view = stage_view(plan_, SecureStage.DONE, reached)
    return {
        "k": plan_.k,
        "t": plan_.t,
        "clip": sa.clip,
        "bits": sa.bits,
        "error_bound": quantise.error_bound(sa.clip, sa.bits),
        "completed": {stage: view["completed"].get(stage, []) for stage in STAGES},
        "dropped_at": view["dropped_at"],
    }


def guarantees(spec: FederationSpec) -> dict[str, str]:
    """What each privacy mechanism of the federation guarantees, in words (the ledger's statement)."""
    out: dict[str, str] = {}
    if spec.privacy is not None:
        p = spec.privacy
        dp = f"(ε = {p.epsilon}, δ = {p.delta})-DP" if p.mechanism == "gaussian" else f"ε = {p.epsilon}-DP"
        out["local_dp"] = (
            f"each update is {dp} per round before it leaves its client ({p.mechanism}, clip {p.clip}): against "
            "anyone who sees it, the coordinator included, whatever else they know"
        )
    if spec.secure_aggregation is not None:
        sa = spec.secure_aggregation
        out["secure_aggregation"] = (
            "the coordinator learns only the weighted mean of each round's surviving updates (at least "
            f"max(min_clients, 3) = {max(spec.min_clients, 3)} of them; t = max(2, floor({sa.threshold}·k) + 1) "
            "shares per secret), not any one update, as long as fewer than t of a client's neighbours collude "
            "with it: each client checks the roster, graph, k, t and its neighbours' signatures, and reveals "
            "shares once, for a survivor set t of its neighbours signed; the mean itself is not noised by "
            "secure aggregation"
            + ("; with local DP, the mean carries the sum of the clients' noise" if spec.privacy else "")
        )
    return out
