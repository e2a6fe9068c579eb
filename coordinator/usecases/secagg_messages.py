"""What a secure round's clients have posted, read back: who answered a stage, the advertised keys,
the envelopes addressed to a client, the revealed shares and what is still missing (queries only)."""

from __future__ import annotations

import json

from fedprompt.coordinator.logic import secagg as rules
from fedprompt.coordinator.logic.round_states import STAGES
from fedprompt.coordinator.persistence.db import SecaggMessage, SecaggRound, Update
from fedprompt.shared.secagg import protocol
from fedprompt.shared.vocab import SecureStage
from sqlalchemy import func, select
from sqlalchemy.orm import Session

_BEFORE: dict[str, SecureStage] = dict(zip(STAGES[1:], STAGES[:-1], strict=True))


def stage_before(stage: str) -> SecureStage:
    """The stage whose finishers a stage expects."""
    return _BEFORE.get(stage, SecureStage.KEYS)


def keys_json(keys: protocol.PeerKeys) -> dict[str, str]:
    """A client's advertised keys as the tasks hand them out."""
    return {
        "encryption_key": protocol.b64(keys.encryption_key),
        "mask_key": protocol.b64(keys.mask_key),
        "seed_commitment": keys.seed_commitment,
    }


def stage_bytes(s: Session, round_id: int) -> dict[str, int]:
    """Bytes the clients sent in each stage of the round attempt (masked: the vectors stored)."""
    rows = s.execute(
        select(SecaggMessage.stage, func.sum(func.length(SecaggMessage.payload)))
        .where(SecaggMessage.round_id == round_id)
        .group_by(SecaggMessage.stage)
    ).all()
    sent = {stage: int(total or 0) for stage, total in rows}
    masked = s.scalar(select(func.sum(Update.size)).where(Update.round_id == round_id)) or 0
    return {stage: int(masked) if stage == SecureStage.MASKED else sent.get(stage, 0) for stage in STAGES}


def expected_numbers(sa_row: SecaggRound, plan: rules.Plan) -> set[int]:
    if sa_row.stage == SecureStage.KEYS:
        return set(plan.indices.values())
    return set(sa_row.reached[stage_before(sa_row.stage)])


def arrived_numbers(s: Session, round_id: int, stage: str, plan: rules.Plan) -> set[int]:
    if stage == SecureStage.MASKED:
        ids = s.scalars(select(Update.client_id).where(Update.round_id == round_id)).all()
    else:
        ids = s.scalars(
            select(SecaggMessage.sender_id)
            .where(SecaggMessage.round_id == round_id, SecaggMessage.stage == stage)
            .distinct()
        ).all()
    return {plan.indices[c] for c in ids if c in plan.indices}


def answered(s: Session, round_id: int, stage: str) -> int:
    """How many clients answered the stage (a count: cheaper than who, while a stage fills)."""
    if stage == SecureStage.MASKED:
        query = select(func.count()).select_from(Update).where(Update.round_id == round_id)
    else:
        query = select(func.count(func.distinct(SecaggMessage.sender_id))).where(
            SecaggMessage.round_id == round_id, SecaggMessage.stage == stage
        )
    return s.scalar(query) or 0


def advertised_keys(
    s: Session, round_id: int, plan: rules.Plan, numbers: list[int] | None = None
) -> dict[int, protocol.PeerKeys]:
    """Advertised keys by number: of the given numbers, or of everyone."""
    query = select(SecaggMessage.sender_id, SecaggMessage.payload).where(
        SecaggMessage.round_id == round_id, SecaggMessage.stage == SecureStage.KEYS
    )
    if numbers is not None:
        client_of = plan.client_of()
        query = query.where(SecaggMessage.sender_id.in_([client_of[j] for j in numbers]))
    return {plan.indices[c]: protocol.PeerKeys.from_json(json.loads(p)) for c, p in s.execute(query)}


def adverts(s: Session, round_id: int, plan: rules.Plan, numbers: list[int]) -> dict[int, dict[str, str]]:
    """The signed advertisements of the given numbers, as their clients sent them."""
    client_of = plan.client_of()
    query = select(SecaggMessage.sender_id, SecaggMessage.payload).where(
        SecaggMessage.round_id == round_id,
        SecaggMessage.stage == SecureStage.KEYS,
        SecaggMessage.sender_id.in_([client_of[j] for j in numbers]),
    )
    return {plan.indices[c]: json.loads(p) for c, p in s.execute(query)}


def consistency_signatures(s: Session, round_id: int, plan: rules.Plan) -> dict[int, str]:
    """Number -> its signature of the survivor set (base64), for every client that sent one."""
    rows = s.execute(
        select(SecaggMessage.sender_id, SecaggMessage.payload).where(
            SecaggMessage.round_id == round_id, SecaggMessage.stage == SecureStage.CONSISTENCY
        )
    )
    return {plan.indices[c]: json.loads(p)["signature"] for c, p in rows}


def envelopes_to(s: Session, round_id: int, plan: rules.Plan, client_id: int) -> dict[int, bytes]:
    rows = s.execute(
        select(SecaggMessage.sender_id, SecaggMessage.payload).where(
            SecaggMessage.round_id == round_id,
            SecaggMessage.stage == SecureStage.SHARES,
            SecaggMessage.recipient_id == client_id,
        )
    ).all()
    return {plan.indices[c]: p for c, p in rows}


def senders_to(s: Session, round_id: int, plan: rules.Plan, client_id: int) -> list[int]:
    return sorted(envelopes_to(s, round_id, plan, client_id))


def included_by(
    s: Session, round_id: int, plan: rules.Plan, reached: dict[str, list[int]]
) -> dict[int, list[int]]:
    """Each dropped client (shared, no masked vector) -> the survivors that masked with it."""
    survivors = set(reached[SecureStage.MASKED])
    dropped = set(reached[SecureStage.SHARES]) - survivors
    client_of = plan.client_of()
    out: dict[int, list[int]] = {j: [] for j in dropped}
    for sender, recipient in s.execute(
        select(SecaggMessage.sender_id, SecaggMessage.recipient_id).where(
            SecaggMessage.round_id == round_id,
            SecaggMessage.stage == SecureStage.SHARES,
            SecaggMessage.sender_id.in_([client_of[j] for j in dropped]),
        )
    ):
        i = plan.indices.get(recipient)
        if i in survivors:
            out[plan.indices[sender]].append(i)
    return {j: sorted(v) for j, v in out.items()}


def revealed(s: Session, round_id: int, plan: rules.Plan) -> dict[int, dict[int, int]]:
    revealed: dict[int, dict[int, int]] = {}
    for holder, payload in s.execute(
        select(SecaggMessage.sender_id, SecaggMessage.payload).where(
            SecaggMessage.round_id == round_id, SecaggMessage.stage == SecureStage.UNMASK
        )
    ):
        for sender, item in json.loads(payload).items():
            revealed.setdefault(int(sender), {})[plan.indices[holder]] = int(item["share"])
    return revealed


def missing_shares(s: Session, round_id: int, plan: rules.Plan, reached: dict[str, list[int]]) -> list[int]:
    needed = rules.needed_secrets(set(reached[SecureStage.MASKED]), included_by(s, round_id, plan, reached))
    return rules.missing_shares(needed, revealed(s, round_id, plan), plan.t)
