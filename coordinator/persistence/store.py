"""The store every use case works through: transactions, the federation lock, and what is cached.

All state lives in the database. Every transition of a federation happens inside a transaction
that first locks the federation's row (``SELECT … FOR UPDATE`` on Postgres; SQLite transactions
take the write lock at BEGIN, queued on this process's WriteLock), then re-reads the state it acts
on. So however many coordinator processes share the database, each round is opened, aggregated and
closed exactly once, and an upload either lands in the round it was accepted for or is refused.

Kept in memory, per process: what never changes once written (validated specs, frozen prompt
versions, the number of clients a round selected) and each federation's change stamp, which the
long-polls of this process share. A transaction that changes a federation's row tells this process's
change listeners once it commits (`add_change_listener`), and on Postgres the other processes too,
through NOTIFY (persistence/notify.py): the long-polls waiting on it look at once instead of at
their next interval.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from fedprompt.coordinator.errors import Invalid, NotFound, revoked_client
from fedprompt.coordinator.logic.evaluation import BEST_RULE, best_version, summarize_evaluations
from fedprompt.coordinator.persistence.db import (
    MAX_ID,
    WRITE_OPTION,
    Client,
    Evaluation,
    Event,
    Federation,
    Participant,
    PromptVersion,
    Round,
    Update,
)
from fedprompt.coordinator.persistence.downloadlog import DownloadLog
from fedprompt.coordinator.persistence.writelock import WriteLock
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import RoundState
from sqlalchemy import and_, bindparam, event, func, select
from sqlalchemy.orm import Session, defer, sessionmaker

# A poll does not write last_seen_at again within the federation's heartbeat interval
# (FederationSpec.heartbeat_s: a tenth of its availability timeout, at most a minute) of the client's
# last recorded one (5 s until the process has read the federation's spec).
HEARTBEAT_MIN_INTERVAL_S = 5.0
# Prompt versions kept in memory, first in first out: the ones read every round are the latest
# (which workers evaluate) and the open round's base, the same version.
VERSION_CACHE_ENTRIES = 8

Stamp = tuple[Any, ...]
CHANNEL = "fedprompt_federation_changed"  # Postgres NOTIFY channel; the payload is the federation id
REVOKED = "fedprompt_client_revoked"  # Postgres NOTIFY channel; the payload is the revoked token's hash
CHANGED = "fedprompt_changed_federations"  # Session.info key: federation ids changed in the transaction
log = logging.getLogger("fedprompt.coordinator")

# The hot paths' statements, built once: a statement made per call costs its construction and its
# cache key on every request (SQLAlchemy then finds the compiled form in its cache).
_FED_ROW = select(Federation.id, Federation.state, Federation.current_round, Federation.latest_version).where(
    Federation.id == bindparam("fid")
)
_OPEN_ROUND_ID = (
    select(Round.id).where(Round.federation_id == bindparam("fid"), Round.state == RoundState.OPEN).limit(1)
)
_HELD = (  # mode async: train tasks handed out since the cutoff and not uploaded, oldest first
    select(Participant.client_id, Round.number, Round.attempt, Round.base_version, Participant.dispatched_at)
    .join(Round, Round.id == Participant.round_id)
    .join(Client, Client.id == Participant.client_id)
    .outerjoin(
        Update, and_(Update.round_id == Participant.round_id, Update.client_id == Participant.client_id)
    )
    .where(
        Round.federation_id == bindparam("fid"),
        Participant.dispatched_at >= bindparam("cutoff"),
        Update.id.is_(None),
        Client.revoked_at.is_(None),  # a revoked client's task frees its slot at once
    )
    .order_by(Participant.dispatched_at)
)
_STAMP = select(
    Federation.state, Federation.current_round, Federation.latest_version, Federation.updated_at
).where(Federation.id == bindparam("fid"))


def no_federation(fid: int) -> NotFound:
    return NotFound(f"federation {fid} does not exist; list them with GET /api/v1/federations")


def final_version(fed: Any, number: int) -> bool:
    """A prompt version that can no longer change: every one but 0, and 0 once round 1 has opened
    (set_initial_prompt replaces it only before that)."""
    return number > 0 or fed.current_round > 0


class Store:
    """Sessions, the federation lock, events, and the caches of what does not change."""

    def __init__(self, sessions: sessionmaker, *, clock: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.clock = clock
        bind = sessions.kw.get("bind")
        self._write_lock = WriteLock() if bind is not None and bind.dialect.name == "sqlite" else None
        self._specs: dict[int, FederationSpec] = {}  # a process serves one database; ids are never reused
        self._spec_json: dict[int, dict[str, Any]] = {}  # the same specs as stored (the JSON handed out)
        self._heartbeat_s: dict[int, float] = {}  # fid -> seconds between recorded polls of a client
        self._selected: dict[int, int] = {}  # round attempt id -> clients selected (fixed at its start)
        self._versions: dict[tuple[int, int], PromptVersion] = {}  # oldest first, VERSION_CACHE_ENTRIES
        self._versions_lock = threading.Lock()
        self._stamps: dict[int, tuple[float, Stamp]] = {}  # fid -> (monotonic read time, stamp)
        self._stamps_lock = threading.Lock()
        self._best: dict[int, tuple[tuple[Any, ...], dict[str, Any] | None]] = {}  # fid -> (stamp, best)
        self.downloads = DownloadLog(self.tx)  # participants' downloaded bytes, written behind
        self._listeners: list[Callable[[int], None]] = []
        self._listeners_lock = threading.Lock()
        self.notify = bind is not None and bind.dialect.name == "postgresql"
        event.listen(sessions, "after_flush", self._note_changes)
        event.listen(sessions, "after_commit", self._tell_changes)
        event.listen(sessions, "after_rollback", lambda s: s.info.pop(CHANGED, None))

    # -- transactions and rows ------------------------------------------------------------------

    @contextmanager
    def tx(self, *, urgent: bool = False) -> Iterator[Session]:
        """A writing transaction (on SQLite, queued on this process's WriteLock; urgent: an upload)."""
        turn = self._write_lock.hold(urgent=urgent) if self._write_lock is not None else nullcontext()
        with turn, self.sessions() as session, session.begin():
            session.connection(execution_options={WRITE_OPTION: True})
            yield session

    def lock_federation(self, s: Session, fid: int, *, shared: bool = False) -> Federation:
        """The federation row, locked until the transaction ends: exclusively (FOR UPDATE) by whatever
        changes the federation or its rounds, shared (FOR SHARE) by uploads, which only need the round
        they add to to stay open, so concurrent uploads commit together and a round closes only once
        none is in flight. SQLite ignores both: its writing transactions are serialised as a whole."""
        query = (
            select(Federation)
            .options(defer(Federation.spec))
            .where(Federation.id == fid)
            .with_for_update(read=shared)
        )
        fed = s.scalars(query).first()
        if fed is None:
            raise no_federation(fid)
        return fed

    def federation(self, s: Session, fid: int) -> Federation:
        """The federation (NotFound if none); its spec is read only where spec_of has not validated it."""
        fed = s.get(Federation, fid, options=[defer(Federation.spec)])
        if fed is None:
            raise no_federation(fid)
        return fed

    def fed_row(self, s: Session, fid: int) -> Any:
        """The federation's changing columns as a plain row (the hot paths' cheap read of it)."""
        row = s.connection().execute(_FED_ROW, {"fid": fid}).first()
        if row is None:
            raise no_federation(fid)
        return row

    def require_active(self, s: Session, client_id: int) -> None:
        """Refuse (403) a client's write, in the write's own transaction, once the client is revoked: the
        authentication cache of this process may still hold a client revoked through another replica."""
        if s.scalar(select(Client.revoked_at).where(Client.id == client_id)) is not None:
            raise revoked_client(client_id)

    def event(self, s: Session, fid: int, kind: str, message: str, round_number: int | None = None) -> None:
        """Add an entry to the federation's audit trail (in the caller's transaction)."""
        s.add(
            Event(
                federation_id=fid,
                kind=kind,
                message=message,
                round_number=round_number,
                created_at=self.clock(),
            )
        )

    def has_open_round(self, s: Session, fid: int) -> bool:
        """Whether a round is open: one column of one row, no ORM object (through the session, which
        flushes first: a round failed in this transaction must not read as open)."""
        return s.execute(_OPEN_ROUND_ID, {"fid": fid}).first() is not None

    def open_round(self, s: Session, fid: int) -> Round | None:
        return s.scalars(
            select(Round).where(Round.federation_id == fid, Round.state == RoundState.OPEN)
        ).first()

    def count_updates(self, s: Session, round_id: int) -> int:
        return s.scalar(select(func.count()).select_from(Update).where(Update.round_id == round_id)) or 0

    def buffer_count(self, s: Session, round_id: int) -> int:
        """Mode async: the updates an open buffer (round) counts, its own and stale ones of closed rounds."""
        return (
            s.scalar(select(func.count()).select_from(Update).where(Update.buffer_round_id == round_id)) or 0
        )

    def held_tasks(self, s: Session, fid: int, spec: FederationSpec, latest: int) -> list[Any]:
        """Mode async: the train tasks held now, oldest first: handed out within round_deadline_s, not
        uploaded, and not yet too stale to be counted (from a version at most max_staleness behind
        `latest`). Each holds one of the spec's concurrency slots."""
        assert spec.max_staleness is not None
        cutoff = self.clock() - spec.round_deadline_s
        rows = s.connection().execute(_HELD, {"fid": fid, "cutoff": cutoff}).all()
        return [row for row in rows if latest - row.base_version <= spec.max_staleness]

    def all_uploaded(self, s: Session, rnd: Any) -> bool:
        """Whether every client the round attempt selected has uploaded (the selection is cached)."""
        selected = self._selected.get(rnd.id)  # fixed when the round opens
        if selected is None:
            selected = s.scalar(
                select(func.count()).select_from(Participant).where(Participant.round_id == rnd.id)
            )
            if selected:
                self._selected[rnd.id] = selected
        if not selected:  # none selected (or no count): never complete
            return False
        return self.count_updates(s, rnd.id) >= selected

    # -- specs ----------------------------------------------------------------------------------

    def spec_of(self, fed: Federation) -> FederationSpec:
        """The federation's validated spec (validated once per process: a spec never changes)."""
        spec = self._specs.get(fed.id)
        return spec if spec is not None else self._remember_spec(fed.id, fed.spec)

    def spec(self, s: Session, fid: int) -> FederationSpec:
        """spec_of by id: no database read once this process has validated the spec."""
        spec = self._specs.get(fid)
        if spec is None:
            raw = s.scalar(select(Federation.spec).where(Federation.id == fid))
            if raw is None:
                raise no_federation(fid)
            spec = self._remember_spec(fid, raw)
        return spec

    def cached_spec(self, fid: int) -> FederationSpec:
        """spec, opening a session only when this process has not validated it yet."""
        spec = self._specs.get(fid)
        if spec is None:
            with self.sessions() as s:
                spec = self.spec(s, fid)
        return spec

    def spec_json(self, fid: int) -> dict[str, Any]:
        """The spec as stored (a copy), read from the database once per process: every enrolment
        answers with it."""
        raw = self._spec_json.get(fid)
        if raw is None:
            with self.sessions() as s:
                raw = s.scalar(select(Federation.spec).where(Federation.id == fid))
            if raw is None:
                raise no_federation(fid)
            self._remember_spec(fid, raw)
        return dict(raw)

    def _remember_spec(self, fid: int, raw: dict[str, Any]) -> FederationSpec:
        self._spec_json[fid] = dict(raw)
        spec = self._specs[fid] = FederationSpec.model_validate(raw)
        self._heartbeat_s[fid] = spec.heartbeat_s
        return spec

    def heartbeat_interval(self, fid: int) -> float:
        """Seconds between two recorded polls of a client of the federation."""
        return self._heartbeat_s.get(fid, HEARTBEAT_MIN_INTERVAL_S)

    # -- prompt versions ------------------------------------------------------------------------

    def version(self, s: Session, fed: Any, number: int) -> PromptVersion | None:
        """A prompt version with its blob; kept in memory once it can no longer change (every version
        but 0, and 0 once round 1 has opened). Versions are 30 KB–2 MB; a federation has one per round."""
        key = (fed.id, number)
        pv = self._versions.get(key)
        if pv is not None:
            return pv
        pv = s.scalars(
            select(PromptVersion).where(
                PromptVersion.federation_id == fed.id, PromptVersion.version == number
            )
        ).first()
        if pv is not None and final_version(fed, number):
            s.expunge(pv)
            with self._versions_lock:
                self._versions[key] = pv
                while len(self._versions) > VERSION_CACHE_ENTRIES:
                    del self._versions[next(iter(self._versions))]
        return pv

    def cached_version(self, fid: int, number: int) -> PromptVersion | None:
        """A prompt version held in memory (see `version`), without I/O; None when it is not held."""
        return self._versions.get((fid, number))

    def version_sha(self, s: Session, fed: Any, number: int) -> str:
        """The sha256 of an existing prompt version (without loading its blob unless it gets cached)."""
        pv = self._versions.get((fed.id, number))
        if pv is not None:
            return pv.sha256
        if final_version(fed, number):
            found = self.version(s, fed, number)
            assert found is not None, f"federation {fed.id} has no prompt version {number}"
            return found.sha256
        return s.scalars(
            select(PromptVersion.sha256).where(
                PromptVersion.federation_id == fed.id, PromptVersion.version == number
            )
        ).one()

    def evaluation_summaries(self, s: Session, fid: int) -> list[dict[str, Any]]:
        """Every evaluated version's summary of the clients' reports, oldest version first."""
        rows = s.execute(
            select(
                Evaluation.version,
                Evaluation.num_samples,
                Evaluation.accuracy,
                Evaluation.loss,
                Evaluation.metrics,
            )
            .where(Evaluation.federation_id == fid)
            .order_by(Evaluation.version)
        ).all()
        by_version: dict[int, list[Any]] = {}
        for row in rows:
            by_version.setdefault(row.version, []).append(row)
        out = [summarize_evaluations(v, reports) for v, reports in by_version.items()]
        return [x for x in out if x is not None]

    def best_version(self, s: Session, fid: int) -> dict[str, Any] | None:
        """The federation's best version by the stated rule (coordinator/logic/evaluation.BEST_RULE)
        with its summary, or None before any evaluation. Kept per federation until an evaluation is
        added (reports are never changed or deleted, so their count and newest id say when): the
        federation's status is read every second by the dashboard and by simulate."""
        stamp = tuple(
            s.execute(
                select(func.count(Evaluation.id), func.max(Evaluation.id)).where(
                    Evaluation.federation_id == fid
                )
            ).one()
        )
        held = self._best.get(fid)
        if held is not None and held[0] == stamp:
            return held[1]
        summaries = self.evaluation_summaries(s, fid)
        best = best_version(summaries)
        found = None
        if best is not None:
            evaluation = next(x for x in summaries if x["version"] == best["version"])
            found = {**best, "rule": BEST_RULE, "evaluation": evaluation}
        self._best[fid] = (stamp, found)
        return found

    def prompt_version(self, s: Session, fid: int, version: str | int) -> tuple[Any, PromptVersion]:
        """The federation's row and a prompt version of it, 'latest', 'best' (the best evaluated one:
        best_version; the latest before any evaluation) or a number (NotFound if none)."""
        fed = self.fed_row(s, fid)
        if version == "latest":
            number = fed.latest_version
        elif version == "best":
            best = self.best_version(s, fid)
            number = fed.latest_version if best is None else best["version"]
        else:
            try:
                number = int(version)
            except ValueError:
                raise Invalid(f"version must be a number or 'latest', not '{version}'") from None
            if not 0 <= number <= MAX_ID:
                raise NotFound(f"prompt version {number} does not exist; the latest is {fed.latest_version}")
        pv = self.version(s, fed, number)
        if pv is None:
            raise NotFound(f"prompt version {number} does not exist; the latest is {fed.latest_version}")
        return fed, pv

    # -- change stamps --------------------------------------------------------------------------

    def add_change_listener(self, listener: Callable[[int], None]) -> None:
        """Call `listener(fid)` (in the committing thread) after each commit that changed federation
        fid's row, and for each change another process announced (on Postgres)."""
        with self._listeners_lock:
            self._listeners.append(listener)

    def remove_change_listener(self, listener: Callable[[int], None]) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def changed(self, fid: int) -> None:
        """Federation fid's row changed (fid < 0: any may have): forget its cached stamp and tell
        the listeners."""
        with self._stamps_lock:  # after any read in flight stored what it saw
            fids = list(self._stamps) if fid < 0 else [fid]
            for one in fids:
                self._stamps.pop(one, None)
        with self._listeners_lock:
            listeners = list(self._listeners)
        for listener, one in itertools.product(listeners, fids):
            try:
                listener(one)
            except Exception:  # a listener's failure must not fail the commit that is already done
                log.exception("a change listener failed")

    def announce_revocation(self, s: Session, token_hash: str) -> None:
        """Tell the other processes, once the caller's transaction commits, that the client of this
        token hash is revoked: they drop it from their authentication caches (Postgres NOTIFY; with
        SQLite there is one process, and the revoking one drops it itself)."""
        if self.notify:
            s.connection().execute(select(func.pg_notify(REVOKED, token_hash)))

    def _note_changes(self, s: Session, _context: Any) -> None:
        """after_flush: remember the federations whose rows this flush changed (and NOTIFY on Postgres,
        which delivers only if the transaction commits)."""
        fids = {o.id for o in s.dirty if isinstance(o, Federation) and s.is_modified(o)}
        if not fids:
            return
        s.info.setdefault(CHANGED, set()).update(fids)
        if self.notify:
            for fid in sorted(fids):
                s.connection().execute(select(func.pg_notify(CHANNEL, str(fid))))

    def _tell_changes(self, s: Session) -> None:
        """after_commit: the changes are visible now; tell this process's listeners."""
        for fid in sorted(s.info.pop(CHANGED, ())):
            self.changed(fid)

    def _cached_stamp(self, fid: int, max_age: float) -> Stamp | None:
        """The federation's change stamp as this process last read it, if younger than max_age (no I/O)."""
        hit = self._stamps.get(fid)
        return hit[1] if hit is not None and time.monotonic() - hit[0] < max_age else None

    def federation_stamp(self, fid: int, max_age: float) -> Stamp:
        """What every client's next task depends on besides its own requests (state, round, version,
        last change), read from the database at most once per max_age by this process: all the
        long-polls waiting on a federation share one query instead of each re-running next_task."""
        with self._stamps_lock:
            stamp = self._cached_stamp(fid, max_age)
            if stamp is None:
                with self.sessions() as s:
                    row = s.connection().execute(_STAMP, {"fid": fid}).first()
                stamp = tuple(row) if row is not None else ()
                self._stamps[fid] = (time.monotonic(), stamp)
        return stamp
