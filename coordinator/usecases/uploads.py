"""What workers send: updates (validated whole, then committed in groups) and evaluation reports.

An upload is checked completely before anything is stored (wire format, shapes, metadata), then
handed to its federation's group commit: the uploads arriving meanwhile are stored together in one
short transaction (coordinator/persistence/groupcommit.py), each with its own answer. Its weight (num_samples)
is clipped to the figure its client enrolled with (logic/uploads.py).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import anyio.to_thread
from fedprompt.coordinator.errors import Invalid, ServiceError
from fedprompt.coordinator.logic.evaluation import (
    PendingReport,
    check_reports,
    one_class,
    predicted_share,
    summarize_evaluations,
)
from fedprompt.coordinator.logic.uploads import (
    Buffer,
    PendingUpload,
    Selection,
    StoredUpdate,
    UploadResult,
    check_update,
    no_replacing,
    parse_update_metadata,
)
from fedprompt.coordinator.persistence.db import (
    Client,
    Evaluation,
    Event,
    Federation,
    Participant,
    Round,
    Update,
)
from fedprompt.coordinator.persistence.groupcommit import AsyncBatcher, GroupCommit, PerFederation
from fedprompt.coordinator.persistence.store import Store, no_federation
from fedprompt.coordinator.usecases.secagg import SecureRounds
from fedprompt.shared import evalstats, wire
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer


class Uploads:
    """Updates and evaluation reports of clients."""

    def __init__(
        self,
        store: Store,
        secure: SecureRounds | None = None,
        on_buffer_full: Callable[[Session, Federation, int], None] | None = None,
        on_report: Callable[[int, int, int], None] | None = None,
        on_upload: Callable[[int, int, int, int], None] | None = None,
    ) -> None:
        self.store = store
        # mode async: writes the version of a full buffer (round id) in the upload's transaction
        self.on_buffer_full = on_buffer_full
        # told after a client's report (fid, version, client) or round update (fid, round, attempt,
        # client) is committed: the task board learns it without a query (Tasks.learn_*)
        self.on_report = on_report
        self.on_upload = on_upload
        self.secure = secure or SecureRounds(store)
        # the writers are looked up when a batch is written (a test may wrap them)
        self._batchers: PerFederation[GroupCommit[PendingUpload, UploadResult]] = PerFederation(
            GroupCommit, lambda fid, items: self._store_update_batch(fid, items)
        )
        self._report_batchers: PerFederation[AsyncBatcher[PendingReport, bool]] = PerFederation(
            AsyncBatcher, lambda fid, items: self._store_reports(fid, items)
        )

    def upload(self, fid: int, number: int, client: Client, body: bytes) -> UploadResult:
        """Accept a client's update for a round: validated fully before anything is stored, then
        committed together with the other uploads arriving meanwhile (see _store_updates)."""
        digest = wire.sha256(body)
        spec = self.store.cached_spec(fid)
        if spec.secure_aggregation is not None:  # a masked vector; the round settles afterwards
            return self.secure.upload_masked(fid, number, client, body)
        try:
            tensors, meta = wire.decode_checked(body, spec.update_shapes())
        except wire.WireError as exc:
            raise Invalid(str(exc)) from None
        num_samples, metrics = parse_update_metadata(meta, spec)
        del tensors  # validated; the blob is stored exactly as received
        pending = PendingUpload(
            number, client.id, body, digest, num_samples, metrics, meta.get("base_version")
        )
        batcher = self._batchers[fid]
        try:
            result = batcher.submit(pending)
        except IntegrityError:  # the same client's concurrent upload for this round committed first
            result = self._concurrent_upload(fid, number, client, digest)
        if self.on_upload is not None and result.buffer_round_id is None:
            self.on_upload(fid, result.round, result.attempt, client.id)
        return result

    def _store_update_batch(
        self, fid: int, items: Sequence[PendingUpload]
    ) -> list[UploadResult | ServiceError]:
        """The checks and inserts of a batch of uploads in one transaction: a handful of column reads
        for the whole batch and one multi-row insert, no ORM objects. On SQLite this transaction
        holds the write lock, so its length bounds how many uploads a second the coordinator takes."""
        if self.store.cached_spec(fid).buffered:
            return self._store_buffered_batch(fid, items)
        with self.store.tx(urgent=True) as s:
            c = s.connection()  # column reads and a multi-row insert on the Core connection
            current_round = c.scalar(  # FOR SHARE: see Store.lock_federation
                select(Federation.current_round).where(Federation.id == fid).with_for_update(read=True)
            )
            if current_round is None:
                return [no_federation(fid) for _ in items]
            attempts: dict[int, list[Any]] = defaultdict(list)  # round number -> attempts, latest first
            for row in c.execute(
                select(Round.id, Round.number, Round.attempt, Round.state, Round.base_version)
                .where(Round.federation_id == fid, Round.number.in_({i.number for i in items}))
                .order_by(Round.number, Round.attempt.desc())
            ):
                attempts[row.number].append(row)
            clients = {i.client_id for i in items}
            round_ids = [r.id for rows in attempts.values() for r in rows]
            stored: dict[tuple[int, int], StoredUpdate] = {
                (row.round_id, row.client_id): StoredUpdate(row.sha256, row.num_samples, row.size)
                for row in c.execute(
                    select(
                        Update.round_id, Update.client_id, Update.sha256, Update.num_samples, Update.size
                    ).where(Update.round_id.in_(round_ids), Update.client_id.in_(clients))
                )
            }
            selected = {
                (row.round_id, row.client_id): Selection(row.revoked_at, row.num_samples)
                for row in c.execute(
                    select(Participant.round_id, Participant.client_id, Client.revoked_at, Client.num_samples)
                    .join(Client, Client.id == Participant.client_id)
                    .where(
                        Participant.round_id.in_([rows[0].id for rows in attempts.values()]),
                        Participant.client_id.in_(clients),
                    )
                )
            }
            out: list[UploadResult | ServiceError] = []
            rows: list[dict[str, Any]] = []
            for item in items:
                try:
                    result = check_update(
                        item, attempts.get(item.number, []), stored, selected, current_round
                    )
                except ServiceError as exc:
                    out.append(exc)
                    continue
                out.append(result)
                if result.created:  # a second upload of the same client in this batch sees this one
                    round_id = attempts[item.number][0].id
                    stored[(round_id, item.client_id)] = StoredUpdate(
                        item.digest, result.num_samples, result.size
                    )
                    rows.append(self._update_row(item, result, round_id))
            if rows:
                c.execute(insert(Update), rows)
                for number in {
                    i.number for i, r in zip(items, out, strict=True) if isinstance(r, UploadResult)
                }:
                    if self.store.all_uploaded(s, attempts[number][0]):
                        out = [
                            dataclasses.replace(r, round_complete=True)
                            if isinstance(r, UploadResult) and r.created and r.round == number
                            else r
                            for r in out
                        ]
        return out

    def _store_buffered_batch(
        self, fid: int, items: Sequence[PendingUpload]
    ) -> list[UploadResult | ServiceError]:
        """Mode async: a batch of uploads stored one after another under the federation's lock, each
        checked against the buffer open at that moment; the upload that fills the buffer writes its
        version in the same transaction (`on_buffer_full`), so a version holds exactly buffer_size
        updates and the next upload counts in the next buffer."""
        spec = self.store.cached_spec(fid)
        assert spec.max_staleness is not None and spec.buffer_size is not None
        out: list[UploadResult | ServiceError] = []
        with self.store.tx(urgent=True) as s:
            try:
                fed = self.store.lock_federation(s, fid)
            except ServiceError as exc:
                return [exc for _ in items]
            c = s.connection()
            for item in items:
                rnd = self.store.open_round(s, fid)
                buffer = None if rnd is None else Buffer(rnd.id, rnd.number, spec.max_staleness)
                attempts = c.execute(
                    select(Round.id, Round.number, Round.attempt, Round.state, Round.base_version)
                    .where(Round.federation_id == fid, Round.number == item.number)
                    .order_by(Round.attempt.desc())
                ).all()
                ids = [r.id for r in attempts]
                stored = {
                    (row.round_id, row.client_id): StoredUpdate(row.sha256, row.num_samples, row.size)
                    for row in c.execute(
                        select(
                            Update.round_id, Update.client_id, Update.sha256, Update.num_samples, Update.size
                        ).where(Update.round_id.in_(ids), Update.client_id == item.client_id)
                    )
                }
                selected = {
                    (row.round_id, row.client_id): Selection(row.revoked_at, row.num_samples)
                    for row in c.execute(
                        select(
                            Participant.round_id, Participant.client_id, Client.revoked_at, Client.num_samples
                        )
                        .join(Client, Client.id == Participant.client_id)
                        .where(Participant.round_id.in_(ids[:1]), Participant.client_id == item.client_id)
                    )
                }
                try:
                    result = check_update(item, attempts, stored, selected, fed.current_round, buffer)
                except ServiceError as exc:
                    out.append(exc)
                    continue
                if result.created:
                    assert buffer is not None and result.buffer_round_id is not None
                    c.execute(insert(Update), [self._update_row(item, result, attempts[0].id)])
                    if spec.concurrency is not None:  # a slot is free: waiting clients look again
                        fed.updated_at = self.store.clock()
                    if self.store.buffer_count(s, buffer.id) >= spec.buffer_size and self.on_buffer_full:
                        self.on_buffer_full(s, fed, buffer.id)
                out.append(result)
        return out

    def _update_row(self, item: PendingUpload, result: UploadResult, round_id: int) -> dict[str, Any]:
        """The updates row of an accepted upload (the blob exactly as received; the buffer it counts
        in and its staleness there in mode async, None in rounds)."""
        return {
            "round_id": round_id,
            "client_id": item.client_id,
            "blob": item.body,
            "sha256": item.digest,
            "num_samples": result.num_samples,
            "metrics": item.metrics,
            "size": result.size,
            "created_at": self.store.clock(),
            "buffer_round_id": result.buffer_round_id,
            "staleness": result.staleness,
        }

    def _concurrent_upload(self, fid: int, number: int, client: Client, digest: str) -> UploadResult:
        """The answer to an upload that lost the race to an upload of the same client for the same
        round: the same acknowledgement if it carried the same bytes, a conflict otherwise."""
        with self.store.sessions() as s:
            row = s.execute(
                select(Update, Round.attempt)
                .options(defer(Update.blob))
                .join(Round, Round.id == Update.round_id)
                .where(Round.federation_id == fid, Round.number == number, Update.client_id == client.id)
                .order_by(Round.attempt.desc())
            ).first()
        if row is not None and row[0].sha256 == digest:
            upd, attempt = row
            return UploadResult(number, attempt, client.id, digest, upd.num_samples, upd.size, created=False)
        raise no_replacing(client.id, number)

    async def report_evaluation(
        self, fid: int, version: int, client: Client, payload: dict[str, Any]
    ) -> bool:
        """Store a client's evaluation of a prompt version; a repeat is a no-op. True if stored.

        Committed like uploads: the reports arriving meanwhile are stored together in one short
        transaction (a thousand clients report each new version within seconds), each with its own
        answer, and none answered before its batch committed. Awaited on the event loop: a report
        holds no request thread while its batch is written (AsyncBatcher)."""
        pending = PendingReport(
            version=version,
            client_id=client.id,
            num_samples=int(payload["num_samples"]),
            accuracy=float(payload["accuracy"]),
            loss=None if payload.get("loss") is None else float(payload["loss"]),
            metrics=payload.get("metrics") or {},
        )
        batcher = self._report_batchers[fid]
        try:
            stored = await batcher.submit(pending)
        except (
            IntegrityError
        ):  # the same client's concurrent report (through another process) committed first
            stored = False
        if self.on_report is not None:  # stored now or before: the report is there either way
            self.on_report(fid, version, client.id)
        if stored and one_class(evalstats.read_confusion(payload.get("metrics"))):
            await anyio.to_thread.run_sync(self._flag_collapse, fid, version)
        return stored

    def _store_reports(self, fid: int, items: Sequence[PendingReport]) -> list[bool | ServiceError]:
        """The checks and the insert of a batch of reports in one transaction: three column reads for
        the whole batch and one multi-row insert. The clients' standing is re-checked here, like an
        upload's: a client revoked through another process is still in this one's authentication
        cache, and reports feed the dashboard's accuracy."""
        clients = {i.client_id for i in items}
        with self.store.tx() as s:
            c = s.connection()
            latest = c.scalar(select(Federation.latest_version).where(Federation.id == fid))
            if latest is None:
                return [no_federation(fid) for _ in items]
            revoked = set(
                c.scalars(select(Client.id).where(Client.id.in_(clients), Client.revoked_at.is_not(None)))
            )
            stored = {
                (row.version, row.client_id)
                for row in c.execute(
                    select(Evaluation.version, Evaluation.client_id).where(
                        Evaluation.federation_id == fid,
                        Evaluation.version.in_({i.version for i in items}),
                        Evaluation.client_id.in_(clients),
                    )
                )
            }
            out = check_reports(items, latest, revoked, stored)
            now = self.store.clock()
            rows = [
                {
                    "federation_id": fid,
                    "version": item.version,
                    "client_id": item.client_id,
                    "num_samples": item.num_samples,
                    "accuracy": item.accuracy,
                    "loss": item.loss,
                    "metrics": item.metrics,
                    "created_at": now,
                }
                for item, answer in zip(items, out, strict=True)
                if answer is True
            ]
            if rows:
                c.execute(insert(Evaluation), rows)
        return out

    def _flag_collapse(self, fid: int, version: int) -> None:
        """Record a 'version_collapsed' event once the reports on a version, summed, show a constant
        predictor (coordinator/logic/evaluation.collapsed) and at least half of the federation's active
        clients reported. Only a report whose own predictions fall to one class leads here, so a
        healthy federation never runs the summary query."""
        with self.store.tx() as s:
            self.store.lock_federation(s, fid)  # one event per version across concurrent reports
            seen = s.scalar(
                select(Event.id).where(
                    Event.federation_id == fid,
                    Event.kind == "version_collapsed",
                    Event.round_number == version,
                )
            )
            if seen is not None:
                return
            active = s.scalar(
                select(func.count())
                .select_from(Client)
                .where(Client.federation_id == fid, Client.revoked_at.is_(None))
            )
            rows = s.scalars(
                select(Evaluation).where(Evaluation.federation_id == fid, Evaluation.version == version)
            ).all()
            summary = summarize_evaluations(version, rows)
            if summary is None or not summary["collapsed"] or 2 * len(rows) < int(active or 0):
                return
            label, share = predicted_share(summary["confusion"]) or (0, 0.0)
            self.store.event(
                s,
                fid,
                "version_collapsed",
                f"version {version} predicts label {label} for {100 * share:.1f} % of the {summary['num_samples']} "
                f"examples {len(rows)} client(s) evaluated: a constant predictor (macro-F1 "
                f"{100 * (summary.get('macro_f1') or 0):.1f} %); the best version stays the one handed out",
                version,
            )
