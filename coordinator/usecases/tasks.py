"""What a worker is asked to do and given: its next task, and the prompt versions it downloads."""

from __future__ import annotations

from typing import Any

from fedprompt.coordinator.db import Client, Evaluation, Participant, PromptVersion, Round, Update
from fedprompt.coordinator.logic.evaluation import evaluation_due
from fedprompt.coordinator.store import Store
from fedprompt.coordinator.usecases.secagg import SecureRounds
from fedprompt.shared.spec import FederationSpec
from sqlalchemy import and_, select, update
from sqlalchemy.orm import Session


class Tasks:
    """A client's next task, and prompt downloads (a participant's counted for the ledger)."""

    def __init__(self, store: Store, secure: SecureRounds | None = None) -> None:
        self.store = store
        self.secure = secure or SecureRounds(store)

    def get_prompt(self, fid: int, version: str | int, *, client: Client | None = None) -> PromptVersion:
        """A prompt version's blob ('latest' or a number); counts a participant's download."""
        record: int | None = None
        with self.store.sessions() as s:  # a read; the download is recorded below only when it changes
            _, pv = self.store.prompt_version(s, fid, version)
            if client is not None:
                part = s.execute(
                    select(Participant.id, Participant.downloaded_bytes)
                    .join(Round, Round.id == Participant.round_id)
                    .where(
                        Round.federation_id == fid,
                        Round.state == "open",
                        Round.base_version == pv.version,
                        Participant.client_id == client.id,
                    )
                ).first()
                if part is not None and part.downloaded_bytes != len(pv.blob):
                    record = part.id
        if record is not None:
            with self.store.tx() as s:
                s.execute(
                    update(Participant).where(Participant.id == record).values(downloaded_bytes=len(pv.blob))
                )
        return pv

    def next_task(self, fid: int, client: Client) -> dict[str, Any] | None:
        """What this client should do now: answer a secure round's keys, shares or unmasking stage
        (first: they take milliseconds and have short deadlines), evaluate the latest prompt (when that
        version is due an evaluation: the spec's eval_every), train for a round, or nothing."""
        with self.store.sessions() as s:
            c = s.connection()  # plain column reads on the Core connection: no ORM result processing
            fed = self.store.fed_row(s, fid)
            spec = self.store.spec(s, fid)
            latest = fed.latest_version
            rnd = c.execute(
                select(Round.id, Round.number, Round.attempt, Round.base_version, Round.deadline_at).where(
                    Round.federation_id == fid, Round.state == "open"
                )
            ).first()
            step = None  # a secure round's stage for this client: its stage decides, uploaded or not
            if spec.secure_aggregation is not None and rnd is not None:
                step = self.secure.task(s, fid, rnd, client.id, spec)
                if step is not None and step["stage"] != "masked":  # the masked stage trains first
                    return step
            if evaluation_due(latest, eval_every=spec.eval_every, rounds=spec.rounds):
                evaluated = c.scalar(
                    select(Evaluation.id)
                    .where(
                        Evaluation.federation_id == fid,
                        Evaluation.version == latest,
                        Evaluation.client_id == client.id,
                    )
                    .limit(1)
                )
                if evaluated is None:
                    return {
                        "kind": "evaluate",
                        "round": latest,
                        "version": latest,
                        "sha256": self.store.version_sha(s, fed, latest),
                    }
            if rnd is not None:
                pending = c.scalar(  # selected for the round and not uploaded yet
                    select(Participant.id)
                    .outerjoin(
                        Update,
                        and_(
                            Update.round_id == Participant.round_id, Update.client_id == Participant.client_id
                        ),
                    )
                    .where(
                        Participant.round_id == rnd.id,
                        Participant.client_id == client.id,
                        Update.id.is_(None),
                    )
                )
                if spec.secure_aggregation is not None:
                    if step is not None:  # train, then upload a masked vector
                        return {
                            **self._train_task(s, fed, rnd, spec),
                            "secure_aggregation": {
                                k: v for k, v in step.items() if k not in ("kind", "round", "version")
                            },
                        }
                elif pending is not None:
                    return self._train_task(s, fed, rnd, spec)
            if fed.state == "completed":
                return {"kind": "done", "round": fed.current_round, "version": fed.latest_version}
        return None

    def _train_task(self, s: Session, fed: Any, rnd: Any, spec: FederationSpec) -> dict[str, Any]:
        """Train from the round's base version and upload."""
        return {
            "kind": "train",
            "round": rnd.number,
            "attempt": rnd.attempt,
            "version": rnd.base_version,
            "sha256": self.store.version_sha(s, fed, rnd.base_version),
            "deadline_at": rnd.deadline_at,
            "config": {
                "local_steps": spec.local_steps,
                "local_epochs": spec.local_epochs,
                "batch_size": spec.batch_size,
                "lr": spec.lr,
                "grad_clip": spec.grad_clip,
                "seed": spec.seed,
            },
        }
