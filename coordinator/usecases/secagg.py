"""Secure aggregation's stages: a secure round's plan, what its clients post (keys, envelopes, masked
vectors, revealed shares), the tasks that ask them for it, stage deadlines and the unmasked sum.

The database holds the public keys, the envelopes (AES-GCM: the coordinator cannot open them), the
masked vectors (in the updates table) and the revealed shares, never a client's update. Every post
locks the federation (like a round's transitions), checks the round's stage and the client's place in
it, stores what it carries, and moves the stage on when it completed it; the round cycle's sweep moves
stages on at their deadlines (RoundCycle, which aggregates or fails the round).
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import numpy as np
from fedprompt.coordinator.errors import Conflict, Forbidden, Gone, Invalid, NotFound, revoked_client
from fedprompt.coordinator.logic import secagg as rules
from fedprompt.coordinator.logic.aggregation import AggregationError
from fedprompt.coordinator.logic.round_states import STAGE_START, STAGES, StageEvent, stage_after
from fedprompt.coordinator.logic.uploads import UploadResult
from fedprompt.coordinator.persistence.db import (
    Client,
    Federation,
    Participant,
    Round,
    SecaggMessage,
    SecaggRound,
    Update,
)
from fedprompt.coordinator.persistence.store import Store
from fedprompt.coordinator.usecases import secagg_messages as msgs
from fedprompt.shared import wire
from fedprompt.shared.secagg import protocol, quantise, shamir, signing
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import RoundState, SecureStage, TaskKind
from sqlalchemy import select, update
from sqlalchemy.orm import Session

PLAN_CACHE_ENTRIES = 64


class SecureRounds:
    """The stages of secure rounds, over the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._plans: dict[tuple[int, str], rules.Plan] = {}  # (round attempt id, graph seed) -> plan
        self._rosters: dict[tuple[int, str], dict[str, Any]] = {}  # (round attempt id, graph seed) -> roster
        self._plans_lock = threading.Lock()

    def _plan(self, sa_row: SecaggRound) -> rules.Plan:
        """The attempt's plan, parsed once per process and graph state (a plan changes once: when the
        keys stage closes and its graph is drawn)."""
        key = (sa_row.round_id, str(sa_row.plan.get("seed", "")))
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = rules.Plan.from_json(sa_row.plan)
                if len(self._plans) >= PLAN_CACHE_ENTRIES:
                    self._plans.pop(next(iter(self._plans)))
                self._plans[key] = plan
            return plan

    def _roster(self, s: Session, round_id: int, plan: rules.Plan, numbers: list[int]) -> dict[str, Any]:
        """The attempt's roster as the shares tasks show it (number -> client id, signing key, digest of
        the signed advertisement), built once per process: it never changes once the keys stage closed."""
        key = (round_id, plan.seed)
        with self._plans_lock:
            roster = self._rosters.get(key)
        if roster is None:
            client_of = plan.client_of()
            roster = {
                str(j): {
                    "client_id": client_of[j],
                    "signing_key": a["signing_key"],
                    "digest": signing.roster_digest(client_of[j], a),
                }
                for j, a in msgs.adverts(s, round_id, plan, numbers).items()
            }
            with self._plans_lock:
                if len(self._rosters) >= PLAN_CACHE_ENTRIES:
                    self._rosters.pop(next(iter(self._rosters)))
                self._rosters[key] = roster
        return roster

    # -- the round cycle's side -----------------------------------------------------------------

    def start(self, s: Session, spec: FederationSpec, rnd: Round, chosen: list[int]) -> None:
        """Plan a secure round that was just opened: the participants' numbers; the keys stage (the
        graph, k and t follow from the roster of keys when that stage closes)."""
        assert spec.secure_aggregation is not None
        plan = rules.plan(chosen)
        rnd.deadline_at = rnd.opened_at + spec.secure_aggregation.stage_deadline_s
        s.add(
            SecaggRound(
                round_id=rnd.id,
                stage=STAGE_START,
                plan=plan.as_json(),
                reached={},
                stage_started_at=rnd.opened_at,
            )
        )

    def progress(self, s: Session, fed: Federation, rnd: Round, spec: FederationSpec) -> rules.StageOutcome:
        """Move the round's stages on as far as their answers and deadlines allow (lock held). Answers
        "next" once the unmasking stage is over (aggregate now), "fail" with the reason, or "wait"."""
        sa_row = self._row(s, rnd.id)
        assert spec.secure_aggregation is not None
        plan = self._plan(sa_row)
        now = self.store.clock()
        while sa_row.stage in STAGES:
            stage = sa_row.stage
            expected = msgs.expected_numbers(sa_row, plan)
            deadline_passed = rnd.deadline_at <= now
            if not deadline_passed and msgs.answered(s, rnd.id, stage) < len(expected):
                return rules.StageOutcome("wait")
            arrived = msgs.arrived_numbers(s, rnd.id, stage, plan)
            outcome = rules.stage_outcome(
                stage,
                expected,
                arrived,
                deadline_passed=deadline_passed,
                t=plan.t,
                quorum=spec.quorum,
                floor=rules.policy(spec).min_survivors,
            )
            if outcome.action == "wait":
                return outcome
            reached = dict(sa_row.reached)
            if outcome.action == "next":
                reached[stage] = sorted(outcome.survivors)
            sa_row.reached = reached
            if outcome.action == "fail":
                sa_row.stage = stage_after(stage, StageEvent.FAIL)
                return outcome
            if stage == SecureStage.UNMASK:
                missing = msgs.missing_shares(s, rnd.id, plan, reached)
                if missing:
                    sa_row.stage = stage_after(stage, StageEvent.FAIL)
                    client_of = plan.client_of()
                    return rules.StageOutcome(
                        "fail",
                        reason="secure aggregation: fewer than t = "
                        f"{plan.t} shares arrived for the secrets of clients {[client_of[j] for j in missing]}",
                    )
                sa_row.stage = stage_after(stage, StageEvent.COMPLETE)
                return outcome
            if stage == SecureStage.KEYS:  # the roster is in: draw the graph from its hash
                roster = {
                    j: signing.roster_digest(plan.client_of()[j], advert)
                    for j, advert in msgs.adverts(s, rnd.id, plan, sorted(outcome.survivors)).items()
                }
                context = protocol.round_context(rnd.federation_id, rnd.number, rnd.attempt)
                plan = rules.graph_plan(plan, roster, rules.policy(spec), context)
                sa_row.plan = plan.as_json()
            sa_row.stage = stage_after(stage, StageEvent.COMPLETE)
            sa_row.stage_started_at = now
            span = (
                spec.round_deadline_s
                if sa_row.stage == SecureStage.MASKED
                else spec.secure_aggregation.stage_deadline_s
            )
            rnd.deadline_at = now + span
            fed.updated_at = now  # wakes the long-polls: the next stage has tasks
            self.store.event(
                s,
                fed.id,
                "secagg_stage",
                f"round {rnd.number}: {len(outcome.survivors)} of {len(expected)} client(s) completed the "
                f"{stage} stage; {sa_row.stage} stage until {rnd.deadline_at:.0f}",
                rnd.number,
            )
        return rules.StageOutcome("wait")

    def aggregate(
        self, s: Session, spec: FederationSpec, rnd: Round, base: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The round's new prompt (base + the weighted mean of the survivors' updates, decoded from the
        unmasked sum) and the stats' record of the secure aggregation."""
        sa = spec.secure_aggregation
        assert sa is not None
        sa_row = self._row(s, rnd.id)
        plan = self._plan(sa_row)
        survivors = set(sa_row.reached[SecureStage.MASKED])
        shapes = spec.tensor_shapes()
        length = sum(int(np.prod(shape)) for shape in shapes.values())
        total = np.zeros(length, dtype=np.uint64)
        weight_total = 0
        for client_id, blob, weight in s.execute(
            select(Update.client_id, Update.blob, Update.num_samples).where(Update.round_id == rnd.id)
        ):
            if plan.indices[client_id] in survivors:
                total = total + protocol.decode_masked(blob, length)
                weight_total += int(weight)
        context = protocol.round_context(rnd.federation_id, rnd.number, rnd.attempt)
        keys = msgs.advertised_keys(s, rnd.id, plan)
        included = msgs.included_by(s, rnd.id, plan, sa_row.reached)
        revealed = msgs.revealed(s, rnd.id, plan)
        record = rules.round_record(sa, plan, sa_row.reached)
        record["weight_total"] = weight_total
        record["bytes_up"] = msgs.stage_bytes(s, rnd.id)
        record["guarantees"] = rules.guarantees(spec)
        try:
            summed = protocol.unmasked_sum(
                total, sorted(survivors), included, revealed, keys, plan.t, context
            )
            mean = quantise.weighted_mean(summed, weight_total, sa.clip, sa.bits)
        except (protocol.ProtocolError, shamir.ShamirError, quantise.QuantisationError) as exc:
            raise AggregationError(f"secure aggregation: {exc}") from None
        outside, worst = rules.sum_outside_clipping(summed, weight_total, sa.bits)
        if outside:
            reason = (
                f"secure aggregation: the unmasked sum is outside what clipping allows in {outside} of "
                f"{length} element(s) (largest S/W {worst:.6g}, at most 2^{sa.bits} − 1 = "
                f"{quantise.levels(sa.bits) - 1}): some survivor uploaded more than its weighted, clipped "
                "update; the aggregate is rejected"
            )
            # the round fails (the caller records the reason); its stats name the rejection
            rnd.stats = {**(rnd.stats or {}), "secure_aggregation": {**record, "rejected": reason}}
            raise AggregationError(reason)
        flat_base = protocol.flatten(base, shapes)
        tensors = protocol.unflatten(flat_base + mean, shapes)
        return tensors, record

    def task(
        self, s: Session, fid: int, rnd: Any, client_id: int, spec: FederationSpec
    ) -> dict[str, Any] | None:
        """The client's secure-aggregation task in the open round, if its stage asks it for something:
        keys or shares or unmasking ({"kind": "secagg"}), or training and a masked upload (the train
        task's "secure_aggregation")."""
        sa_row = s.get(SecaggRound, rnd.id)
        if sa_row is None:
            return None
        plan = self._plan(sa_row)
        own = plan.indices.get(client_id)
        if own is None:
            return None
        stage = sa_row.stage
        reached = sa_row.reached
        if stage != SecureStage.KEYS and own not in reached.get(msgs.stage_before(stage), []):
            return None
        posted = s.scalar(
            select(SecaggMessage.id)
            .where(
                SecaggMessage.round_id == rnd.id,
                SecaggMessage.stage == stage,
                SecaggMessage.sender_id == client_id,
            )
            .limit(1)
        )
        if stage == SecureStage.MASKED:
            posted = s.scalar(
                select(Update.id).where(Update.round_id == rnd.id, Update.client_id == client_id)
            )
        if posted is not None or stage in (SecureStage.DONE, SecureStage.FAILED):
            return None
        sa = spec.secure_aggregation
        assert sa is not None
        base = {
            "kind": TaskKind.SECAGG,
            "stage": stage,
            "round": rnd.number,
            "attempt": rnd.attempt,
            "version": rnd.base_version,
            "index": own,
            "t": plan.t,
            "deadline_at": rnd.deadline_at,
        }
        if stage == SecureStage.KEYS:
            return {**base, "client_id": client_id}
        if stage == SecureStage.SHARES:
            client_of = plan.client_of()
            recipients = rules.recipients(plan, own, set(reached[SecureStage.KEYS]))
            adverts = msgs.adverts(s, rnd.id, plan, recipients)
            return {
                **base,
                "k": plan.k,
                "roster": self._roster(s, rnd.id, plan, reached[SecureStage.KEYS]),
                "neighbours": {str(j): {"client_id": client_of[j], **adverts[j]} for j in recipients},
            }
        if stage == SecureStage.CONSISTENCY:
            return {**base, "survivors": reached[SecureStage.MASKED]}
        envelopes = msgs.envelopes_to(s, rnd.id, plan, client_id)
        keys = msgs.advertised_keys(s, rnd.id, plan, list(envelopes))
        peers = {str(j): msgs.keys_json(keys[j]) for j in envelopes}
        env = {str(j): base64.b64encode(e).decode() for j, e in envelopes.items()}
        if stage == SecureStage.MASKED:
            return {
                **base,
                "envelopes": env,
                "peers": peers,
                "clip": sa.clip,
                "bits": sa.bits,
            }
        survivors = reached[SecureStage.MASKED]
        dropped = sorted(set(reached[SecureStage.SHARES]) - set(survivors))
        # only its neighbours' signatures: the ones it checks (the consistency check of shared/secagg/client.py)
        mine = set(plan.neighbours.get(own, []))
        signatures = {j: sig for j, sig in msgs.consistency_signatures(s, rnd.id, plan).items() if j in mine}
        return {
            **base,
            "envelopes": env,
            "peers": peers,
            "survivors": survivors,
            "dropped": dropped,
            "signatures": {str(j): sig for j, sig in signatures.items()},
        }

    # -- what clients post ----------------------------------------------------------------------

    def post(self, fid: int, number: int, client: Client, stage: str, payload: Any) -> dict[str, Any]:
        """Store a client's keys, envelopes or revealed shares for the open round's current stage; an
        identical repeat is answered the same, a different one refused (409). The caller settles the
        round afterwards (RoundCycle.settle)."""
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            spec = self.store.spec_of(fed)
            rnd, sa_row, plan, own = self._place(s, fid, number, client, spec)
            reached = sa_row.reached
            context = protocol.round_context(fid, number, rnd.attempt)
            if stage == SecureStage.KEYS:
                pinned = s.scalar(select(Client.signing_key).where(Client.id == client.id))
                advert = rules.parse_keys(payload, context, own, client.id, pinned)
                rows = {0: json.dumps(advert, sort_keys=True).encode()}
                if pinned is None:  # the first key a client shows is its key from now on
                    s.execute(
                        update(Client).where(Client.id == client.id).values(signing_key=advert["signing_key"])
                    )
            elif stage == SecureStage.CONSISTENCY:
                if own not in reached.get(SecureStage.MASKED, []):
                    raise self._not_now(stage, sa_row.stage, number)
                key = s.scalar(select(Client.signing_key).where(Client.id == client.id))
                if key is None:
                    raise Invalid(f"client {client.id} has no signing key: it advertised no keys")
                masked = reached[SecureStage.MASKED]
                message = signing.consistency_message(context, bytes.fromhex(plan.seed), masked)
                rows = {0: json.dumps({"signature": rules.parse_consistency(payload, key, message)}).encode()}
            elif stage == SecureStage.SHARES:
                if own not in reached.get(SecureStage.KEYS, []):
                    raise self._not_now(stage, sa_row.stage, number)
                expected = rules.recipients(plan, own, set(reached[SecureStage.KEYS]))
                client_of = plan.client_of()
                rows = {client_of[j]: e for j, e in rules.parse_envelopes(payload, expected).items()}
            elif stage == SecureStage.UNMASK:
                if own not in reached.get(SecureStage.CONSISTENCY, []):
                    raise self._not_now(stage, sa_row.stage, number)
                senders = set(msgs.senders_to(s, rnd.id, plan, client.id))
                survivors = set(reached[SecureStage.MASKED])
                dropped = set(reached[SecureStage.SHARES]) - survivors
                parsed = rules.parse_reveal(payload, senders & survivors, senders & dropped)
                rows = {
                    0: json.dumps(
                        {str(j): {"kind": v["kind"], "share": str(v["share"])} for j, v in parsed.items()},
                        sort_keys=True,
                    ).encode()
                }
            else:
                raise NotFound(f"no secure aggregation stage '{stage}'")
            existing = {
                m.recipient_id: m.payload
                for m in s.scalars(
                    select(SecaggMessage).where(
                        SecaggMessage.round_id == rnd.id,
                        SecaggMessage.stage == stage,
                        SecaggMessage.sender_id == client.id,
                    )
                )
            }
            if existing:
                if existing == rows:
                    return {"round": number, "attempt": rnd.attempt, "stage": stage, "stored": False}
                raise Conflict(
                    f"client {client.id} already sent different {stage} for round {number}; they cannot be replaced"
                )
            if sa_row.stage != stage:
                raise self._not_now(stage, sa_row.stage, number)
            now = self.store.clock()
            s.add_all(
                SecaggMessage(
                    round_id=rnd.id,
                    stage=stage,
                    sender_id=client.id,
                    recipient_id=r,
                    payload=p,
                    created_at=now,
                )
                for r, p in rows.items()
            )
            return {"round": number, "attempt": rnd.attempt, "stage": stage, "stored": True}

    def upload_masked(self, fid: int, number: int, client: Client, body: bytes) -> UploadResult:
        """Store a client's masked vector (the masked stage's answer). An identical re-send is answered
        200; a different vector from the same client, one made for another attempt, round or client, or
        one outside the masked stage is refused. The caller settles the round afterwards."""
        digest = wire.sha256(body)
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            spec = self.store.spec_of(fed)
            attempts = s.scalars(
                select(Round)
                .where(Round.federation_id == fid, Round.number == number)
                .order_by(Round.attempt.desc())
            ).all()
            for r in attempts:
                held = s.execute(
                    select(Update.sha256, Update.num_samples, Update.size).where(
                        Update.round_id == r.id, Update.client_id == client.id
                    )
                ).first()
                if held is not None and held.sha256 == digest:
                    if r.state == RoundState.FAILED:
                        raise Conflict(
                            f"this masked vector was made for attempt {r.attempt} of round {number}, which "
                            "failed; its masks are bound to that attempt"
                        )
                    return UploadResult(number, r.attempt, client.id, digest, held.num_samples, held.size)
                if held is not None and r.state == RoundState.OPEN:
                    raise Conflict(
                        f"client {client.id} already uploaded a different masked vector for round {number}; "
                        "it cannot be replaced"
                    )
            rnd, sa_row, plan, own = self._place(s, fid, number, client, spec)
            if sa_row.stage != SecureStage.MASKED or own not in sa_row.reached.get(SecureStage.SHARES, []):
                raise self._not_now(SecureStage.MASKED, sa_row.stage, number)
            try:
                meta = wire.read_metadata(body)
                length = sum(int(np.prod(shape)) for shape in spec.tensor_shapes().values())
                protocol.decode_masked(body, length)
            except (wire.WireError, protocol.ProtocolError) as exc:
                raise Invalid(str(exc)) from None
            weight, metrics = rules.masked_metadata(meta, number, rnd.attempt, own)
            enrolled = s.scalar(select(Client.num_samples).where(Client.id == client.id)) or 1
            if weight > max(enrolled, 1):
                raise Invalid(
                    f"weight {weight} exceeds the {enrolled} samples client {client.id} enrolled with"
                )
            s.add(
                Update(
                    round_id=rnd.id,
                    client_id=client.id,
                    blob=body,
                    sha256=digest,
                    num_samples=weight,
                    metrics={k: v for k, v in metrics.items() if isinstance(v, int | float)},
                    size=len(body),
                    created_at=self.store.clock(),
                )
            )
            return UploadResult(
                number, rnd.attempt, client.id, digest, weight, len(body), created=True, round_complete=True
            )

    def _place(
        self, s: Session, fid: int, number: int, client: Client, spec: FederationSpec
    ) -> tuple[Round, SecaggRound, rules.Plan, int]:
        if spec.secure_aggregation is None:
            raise NotFound(f"federation {fid} does not use secure aggregation")
        rnd = self.store.open_round(s, fid)
        if rnd is None or rnd.number != number:
            raise Gone(f"round {number} is not open" + (f"; round {rnd.number} is" if rnd else ""))
        if s.scalar(select(Client.revoked_at).where(Client.id == client.id)) is not None:
            raise revoked_client(client.id)
        selected = s.scalar(
            select(Participant.id).where(Participant.round_id == rnd.id, Participant.client_id == client.id)
        )
        sa_row = s.get(SecaggRound, rnd.id)
        if selected is None or sa_row is None:
            raise Forbidden(f"client {client.id} was not selected for round {number}")
        plan = self._plan(sa_row)
        return rnd, sa_row, plan, plan.indices[client.id]

    @staticmethod
    def _not_now(stage: str, current: str, number: int) -> Conflict:
        return Conflict(
            f"round {number} is in its {current} stage; {stage} are not taken from this client now"
        )

    def _row(self, s: Session, round_id: int) -> SecaggRound:
        row = s.get(SecaggRound, round_id)
        if row is None:
            raise Conflict(f"round attempt {round_id} has no secure aggregation plan")
        return row
