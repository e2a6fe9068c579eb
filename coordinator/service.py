"""The coordinator's use cases: federations, enrolment, rounds, uploads, evaluation.

All state lives in the database. Every transition of a federation happens inside a transaction
that first locks the federation's row (``SELECT … FOR UPDATE`` on Postgres; SQLite transactions
take the write lock at BEGIN), then re-reads the state it acts on. So however many coordinator
processes share the database, each round is opened, aggregated and closed exactly once, and an
upload either lands in the round it was accepted for or is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import ValidationError
from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer, sessionmaker

from coordinator.db import (
    MAX_ID,
    WRITE_OPTION,
    Client,
    EnrollmentToken,
    Evaluation,
    Event,
    Federation,
    Participant,
    PromptVersion,
    RevokedSession,
    Round,
    ServerOptimizerState,
    Update,
)
from coordinator.errors import Conflict, Forbidden, Gone, Invalid, NotFound, ServiceError, Unauthorized
from coordinator.groupcommit import GroupCommit
from coordinator.logic import server_optim
from coordinator.logic.aggregation import (
    AggregationError,
    AggregationResult,
    aggregate,
    check_params,
    fedavg_stream,
)
from coordinator.logic.ledger import ledger
from coordinator.logic.selection import select_clients
from coordinator.writelock import WriteLock
from shared import evalstats, export, jsonlimits, wire
from shared.privacy import gaussian_noise_multiplier, spent_epsilon
from shared.spec import FederationSpec, PrivacySpec, ServerOptimizerSpec, initial_prompt

# A poll does not write last_seen_at again within a tenth of the federation's availability timeout
# of the client's last recorded one, and never more than this long (5 s until the process has read
# the federation's spec).
HEARTBEAT_MAX_INTERVAL_S = 60.0
HEARTBEAT_MIN_INTERVAL_S = 5.0
# Past this many cached tokens the authentication cache starts afresh (it holds one entry per client).
AUTH_CACHE_MAX_ENTRIES = 100_000
# Prompt versions kept in memory, first in first out: the ones read every round are the latest
# (which workers evaluate) and the open round's base, the same version.
VERSION_CACHE_ENTRIES = 8


def hash_token(token: str) -> str:
    """Tokens are stored only as their sha256 (they are long random strings, so no salt is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    """A fresh random bearer token with a readable prefix."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"


@dataclass(frozen=True)
class UploadResult:
    """What an upload returns; an identical retry returns the same."""

    created: bool
    round: int
    attempt: int
    client_id: int
    sha256: str
    num_samples: int
    size: int
    # the round had every selected client's update once this one's batch was stored (then the
    # caller closes it: after_upload); across replicas, a round two batches complete together is
    # closed by the deadline sweep, within FEDPROMPT_SWEEP_INTERVAL_S
    round_complete: bool = False


@dataclass(frozen=True)
class PendingUpload:
    """A validated update on its way into the database (see Coordinator.upload)."""

    number: int
    client_id: int
    body: bytes
    digest: str
    num_samples: int
    metrics: dict[str, Any]
    base_version: str | None


class _Stored(NamedTuple):
    """What the checks need of an update already stored."""

    sha256: str
    num_samples: int
    size: int


class Coordinator:
    """The service layer: routes call these methods and nothing else touches the database."""

    def __init__(
        self,
        sessions: sessionmaker,
        *,
        clock: Callable[[], float] = time.time,
        auth_cache_s: float = 30.0,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self._stamps: dict[int, tuple[float, tuple[Any, ...]]] = {}  # fid -> (monotonic read time, stamp)
        self._stamps_lock = threading.Lock()
        # What never changes once written, read on every request: specs and frozen prompt versions.
        self._specs: dict[int, FederationSpec] = {}  # a process serves one database; ids are never reused
        self._heartbeat_s: dict[int, float] = {}  # fid -> seconds between recorded polls of a client
        self._uploads: dict[int, GroupCommit[PendingUpload, UploadResult]] = {}  # fid -> its group commit
        self._selected: dict[int, int] = {}  # round attempt id -> clients selected (fixed at its start)
        self._versions: dict[tuple[int, int], PromptVersion] = {}  # oldest first, VERSION_CACHE_ENTRIES
        self._versions_lock = threading.Lock()
        # token hash -> (monotonic time checked, client): requests of a client within auth_cache_s of
        # its last check skip the lookup. A revocation by this process drops the client's entry at
        # once; one made by another process is refused here within auth_cache_s, and an upload checks
        # revocation in its own transaction whatever the cache says.
        self.auth_cache_s = auth_cache_s
        self._auth: dict[str, tuple[float, Client]] = {}
        bind = sessions.kw.get("bind")
        self._write_lock = WriteLock() if bind is not None and bind.dialect.name == "sqlite" else None

    # -- plumbing -----------------------------------------------------------------------------

    @contextmanager
    def _tx(self, *, urgent: bool = False) -> Iterator[Session]:
        """A writing transaction (on SQLite, queued on this process's WriteLock; urgent: an upload)."""
        turn = self._write_lock.hold(urgent=urgent) if self._write_lock is not None else nullcontext()
        with turn, self.sessions() as session, session.begin():
            session.connection(execution_options={WRITE_OPTION: True})
            yield session

    def _lock_federation(self, s: Session, fid: int, *, shared: bool = False) -> Federation:
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
            raise _no_federation(fid)
        return fed

    def _federation(self, s: Session, fid: int) -> Federation:
        # the spec (a JSON document) is read only where spec_of has not validated it yet
        fed = s.get(Federation, fid, options=[defer(Federation.spec)])
        if fed is None:
            raise _no_federation(fid)
        return fed

    def _event(self, s: Session, fid: int, kind: str, message: str, round_number: int | None = None) -> None:
        s.add(
            Event(
                federation_id=fid,
                kind=kind,
                message=message,
                round_number=round_number,
                created_at=self.clock(),
            )
        )

    def spec_of(self, fed: Federation) -> FederationSpec:
        """The federation's validated spec (validated once per process: a spec never changes)."""
        spec = self._specs.get(fed.id)
        return spec if spec is not None else self._remember_spec(fed.id, fed.spec)

    def _spec(self, s: Session, fid: int) -> FederationSpec:
        """spec_of by id: no database read once this process has validated the spec."""
        spec = self._specs.get(fid)
        if spec is None:
            raw = s.scalar(select(Federation.spec).where(Federation.id == fid))
            if raw is None:
                raise _no_federation(fid)
            spec = self._remember_spec(fid, raw)
        return spec

    def _remember_spec(self, fid: int, raw: dict[str, Any]) -> FederationSpec:
        spec = self._specs[fid] = FederationSpec.model_validate(raw)
        self._heartbeat_s[fid] = min(HEARTBEAT_MAX_INTERVAL_S, spec.availability_timeout_s / 10)
        return spec

    def _fed_row(self, s: Session, fid: int) -> Any:
        """The federation's changing columns as a plain row (the hot paths' cheap read of it)."""
        columns = (Federation.id, Federation.state, Federation.current_round, Federation.latest_version)
        row = s.connection().execute(select(*columns).where(Federation.id == fid)).first()
        if row is None:
            raise _no_federation(fid)
        return row

    def _version(self, s: Session, fed: Any, number: int) -> PromptVersion | None:
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
        if pv is not None and _final_version(fed, number):
            s.expunge(pv)
            with self._versions_lock:
                self._versions[key] = pv
                while len(self._versions) > VERSION_CACHE_ENTRIES:
                    del self._versions[next(iter(self._versions))]
        return pv

    def _version_sha(self, s: Session, fed: Any, number: int) -> str:
        """The sha256 of an existing prompt version (without loading its blob unless it gets cached)."""
        pv = self._versions.get((fed.id, number))
        if pv is not None:
            return pv.sha256
        if _final_version(fed, number):
            found = self._version(s, fed, number)
            assert found is not None, f"federation {fed.id} has no prompt version {number}"
            return found.sha256
        return s.scalars(
            select(PromptVersion.sha256).where(
                PromptVersion.federation_id == fed.id, PromptVersion.version == number
            )
        ).one()

    # -- federations --------------------------------------------------------------------------

    def create_federation(self, spec: FederationSpec) -> Federation:
        """Create a federation and its seeded initial prompt (version 0)."""
        try:
            check_params(spec.aggregation.name, spec.aggregation.params)
        except AggregationError as exc:
            raise Invalid(f"invalid federation spec: aggregation: {exc}", field="aggregation") from None
        now = self.clock()
        blob = wire.encode(initial_prompt(spec), {"version": "0", "method": spec.method})
        with self._tx() as s:
            fed = Federation(
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                state="waiting",
                paused=False,
                current_round=0,
                latest_version=0,
                created_at=now,
                updated_at=now,
            )
            s.add(fed)
            s.flush()
            s.add(
                PromptVersion(
                    federation_id=fed.id, version=0, blob=blob, sha256=wire.sha256(blob), created_at=now
                )
            )
            self._event(s, fed.id, "created", f"federation '{spec.name}' created")
        return fed

    def set_initial_prompt(self, fid: int, body: bytes) -> PromptVersion:
        """Replace version 0 (e.g. with a vocabulary-initialised prompt) before the first round opens."""
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            spec = self.spec_of(fed)
            try:
                tensors, _ = wire.decode_checked(body, spec.tensor_shapes())
            except wire.WireError as exc:
                raise Invalid(str(exc)) from None
            if fed.current_round > 0:
                raise Conflict("the initial prompt can only be replaced before round 1 opens")
            blob = wire.encode(tensors, {"version": "0", "method": spec.method})
            pv = s.scalars(
                select(PromptVersion).where(PromptVersion.federation_id == fid, PromptVersion.version == 0)
            ).one()
            pv.blob, pv.sha256, pv.created_at = blob, wire.sha256(blob), self.clock()
            self._event(s, fid, "initial_prompt", "initial prompt replaced")
        return pv

    def list_federations(self) -> list[dict[str, Any]]:
        """Status of every federation."""
        with self.sessions() as s:
            ids = s.scalars(select(Federation.id).order_by(Federation.id)).all()
        return [self.federation_status(fid) for fid in ids]

    def federation_status(self, fid: int) -> dict[str, Any]:
        """State, round, clients and latest metrics of one federation."""
        now = self.clock()
        with self.sessions() as s:
            fed = self._federation(s, fid)
            spec = self.spec_of(fed)
            clients = s.scalars(select(Client).where(Client.federation_id == fid)).all()
            active = [c for c in clients if c.revoked_at is None]
            available = [c for c in active if now - c.last_seen_at <= spec.availability_timeout_s]
            open_round = self._open_round(s, fid)
            latest_closed = s.scalars(
                select(Round)
                .where(Round.federation_id == fid, Round.state == "closed")
                .order_by(Round.number.desc())
                .limit(1)
            ).first()
            out: dict[str, Any] = {
                "id": fed.id,
                "name": fed.name,
                "state": fed.state,
                "paused": fed.paused,
                "current_round": fed.current_round,
                "rounds_total": spec.rounds,
                "latest_version": fed.latest_version,
                "clients": {"enrolled": len(clients), "active": len(active), "available": len(available)},
                "open_round": self._round_summary(s, open_round) if open_round else None,
                "latest": self._round_summary(s, latest_closed) if latest_closed else None,
                "spec": fed.spec,
                "created_at": fed.created_at,
            }
            closed = s.execute(
                select(Round.number, Round.stats)
                .where(Round.federation_id == fid, Round.state == "closed")
                .order_by(Round.number)
            ).all()
            out["ledger"] = ledger(
                [(n, st or {}) for n, st in closed],
                params_per_client=spec.params_communicated(),
                params_full_model=spec.params_full_model,
                per_client=_traffic_per_client(s, fid),
            )
            if spec.privacy is not None:
                out["privacy"] = _privacy_record(s, fid, spec.privacy)
        return out

    def export_prompt(self, fid: int, version: str | int, fmt: str) -> tuple[str, bytes]:
        """A prompt version in an outside format: (file name, bytes); 'peft' is a zipped PEFT adapter folder."""
        if fmt not in export.FORMATS:
            raise Invalid(f"unknown export format '{fmt}'; choose one of {', '.join(export.FORMATS)}")
        pv = self.get_prompt(fid, version)
        with self.sessions() as s:
            spec = self.spec_of(self._federation(s, fid))
        tensors, _ = wire.decode(pv.blob)
        try:
            archive = export.peft_zip(spec, tensors, version=pv.version)
        except export.ExportError as exc:
            raise Invalid(f"cannot export federation {fid} as {fmt}: {exc}") from None
        return f"federation-{fid}-v{pv.version}-peft.zip", archive

    def federation_spec(self, fid: int) -> dict[str, Any]:
        """The federation's spec as JSON."""
        with self.sessions() as s:
            return dict(self._federation(s, fid).spec)

    def set_paused(self, fid: int, paused: bool) -> dict[str, Any]:
        """Pause (no new rounds open automatically) or resume (open the next round if due)."""
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            if fed.state == "completed":
                raise Conflict(f"federation {fid} is completed; there is nothing to pause or resume")
            fed.paused = paused
            fed.updated_at = self.clock()
            self._event(s, fid, "paused" if paused else "resumed", "paused" if paused else "resumed")
            if not paused:
                self._advance(s, fed, manual=False)
        return self.federation_status(fid)

    # -- enrolment and clients ----------------------------------------------------------------

    def create_enrollment_token(
        self, fid: int, *, expires_in_s: float | None = None, max_uses: int | None = None
    ) -> tuple[str, EnrollmentToken]:
        """Issue an enrolment token (shown once); optional expiry and use limit."""
        token = new_token("fpe")
        now = self.clock()
        with self._tx() as s:
            self._federation(s, fid)
            row = EnrollmentToken(
                federation_id=fid,
                token_hash=hash_token(token),
                expires_at=None if expires_in_s is None else now + expires_in_s,
                max_uses=max_uses,
                uses=0,
                created_at=now,
            )
            s.add(row)
        return token, row

    def enroll(
        self, fid: int, token: str, *, name: str, num_samples: int, info: dict[str, Any]
    ) -> tuple[Client, str]:
        """Exchange an enrolment token for a client id and a client token (shown once)."""
        now = self.clock()
        client_token = new_token("fpc")
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            row = s.scalars(
                select(EnrollmentToken).where(
                    EnrollmentToken.token_hash == hash_token(token), EnrollmentToken.federation_id == fid
                )
            ).first()
            if row is None:
                raise Unauthorized(
                    f"unknown enrolment token for federation {fid}; ask the operator for a new one"
                )
            if row.expires_at is not None and now > row.expires_at:
                raise Unauthorized("this enrolment token has expired; ask the operator for a new one")
            if row.max_uses is not None and row.uses >= row.max_uses:
                raise Unauthorized(
                    f"this enrolment token is used up ({row.max_uses} uses); ask for a new one"
                )
            spec = self.spec_of(fed)
            fingerprint = info.get("model_fingerprint")
            if spec.model_fingerprint and fingerprint and fingerprint != spec.model_fingerprint:
                raise Conflict(
                    f"your model's fingerprint {fingerprint} differs from the federation's "
                    f"{spec.model_fingerprint}; load the model '{spec.model}'"
                )
            row.uses += 1
            client = Client(
                federation_id=fid,
                name=name,
                token_hash=hash_token(client_token),
                num_samples=num_samples,
                info=info,
                enrolled_at=now,
                last_seen_at=now,
            )
            s.add(client)
            s.flush()
            self._event(
                s, fid, "client_enrolled", f"client {client.id} '{name}' enrolled ({num_samples} samples)"
            )
            if fed.state == "waiting" and spec.auto_advance:
                self._advance(s, fed, manual=False)
        return client, client_token

    def cached_client(self, token: str) -> Client | None:
        """The client of a token checked within the last auth_cache_s seconds, if any (no I/O)."""
        hit = self._auth.get(hash_token(token))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < self.auth_cache_s else None

    def authenticate_client(self, fid: int, token: str) -> Client:
        """The client owning a bearer token in this federation (read-only: refusals change nothing)."""
        client = self.cached_client(token)
        if client is None:
            digest = hash_token(token)
            with self.sessions() as s:
                client = s.scalars(select(Client).where(Client.token_hash == digest)).first()
            if client is not None and client.revoked_at is None and self.auth_cache_s > 0:
                if len(self._auth) >= AUTH_CACHE_MAX_ENTRIES:
                    self._auth.clear()
                self._auth[digest] = (time.monotonic(), client)
        if client is None:
            raise Unauthorized("unknown client token; enrol again with an enrolment token")
        if client.federation_id != fid:
            raise Forbidden(f"this client token belongs to federation {client.federation_id}, not {fid}")
        if client.revoked_at is not None:
            raise Forbidden(f"client {client.id} was revoked by the operator")
        return client

    def heartbeat_due(self, client: Client) -> bool:
        """Whether a poll should record the client as seen (not when it was, moments ago: availability
        is judged in minutes, so the write transaction is spared)."""
        interval = self._heartbeat_s.get(client.federation_id, HEARTBEAT_MIN_INTERVAL_S)
        return not 0 <= self.clock() - client.last_seen_at < interval

    def heartbeat(self, client: Client) -> None:
        """Record that a client is alive (its task poll); unseen clients are not selected."""
        if not self.heartbeat_due(client):
            return
        now = self.clock()
        with self._tx() as s:
            s.execute(update(Client).where(Client.id == client.id).values(last_seen_at=now))
        client.last_seen_at = now  # the cached copy too, so the next polls skip the write

    def list_clients(self, fid: int) -> list[dict[str, Any]]:
        """Every client with its activity."""
        with self.sessions() as s:
            self._federation(s, fid)
            clients = s.scalars(select(Client).where(Client.federation_id == fid).order_by(Client.id)).all()
            rounds = _count_per_client(s, Participant, fid)
            uploads = _count_per_client(s, Update, fid)
        return [
            {
                "id": c.id,
                "name": c.name,
                "num_samples": c.num_samples,
                "enrolled_at": c.enrolled_at,
                "last_seen_at": c.last_seen_at,
                "revoked": c.revoked_at is not None,
                "rounds_selected": rounds.get(c.id, 0),
                "updates": uploads.get(c.id, 0),
                "info": c.info,
            }
            for c in clients
        ]

    def revoke_client(self, fid: int, cid: int) -> None:
        """Revoke a client: its token stops working and it is never selected again."""
        with self._tx() as s:
            self._lock_federation(s, fid)
            client = s.get(Client, cid)
            if client is None or client.federation_id != fid:
                raise NotFound(f"client {cid} is not enrolled in federation {fid}")
            if client.revoked_at is None:
                client.revoked_at = self.clock()
                self._event(s, fid, "client_revoked", f"client {cid} revoked")
            token_hash = client.token_hash
        self._auth.pop(token_hash, None)

    # -- dashboard sessions -------------------------------------------------------------------

    def revoke_session(self, session_id: str, expires_at: float) -> None:
        """Record a dashboard session as ended (its logout), so that no replica accepts its cookie
        again; records of sessions past their expiry are dropped meanwhile (they are refused anyway)."""
        now = self.clock()
        digest = hash_token(session_id)
        try:
            with self._tx() as s:
                s.execute(delete(RevokedSession).where(RevokedSession.expires_at < now))
                if s.scalar(select(RevokedSession.id).where(RevokedSession.session_hash == digest)) is None:
                    s.add(RevokedSession(session_hash=digest, expires_at=expires_at, revoked_at=now))
        except IntegrityError:  # the same session's concurrent logout recorded it first
            pass

    def session_revoked(self, session_id: str) -> bool:
        """Whether a dashboard session was ended by its logout (one indexed read)."""
        with self.sessions() as s:
            digest = hash_token(session_id)
            return (
                s.scalar(select(RevokedSession.id).where(RevokedSession.session_hash == digest)) is not None
            )

    # -- rounds -------------------------------------------------------------------------------

    def _open_round(self, s: Session, fid: int) -> Round | None:
        return s.scalars(select(Round).where(Round.federation_id == fid, Round.state == "open")).first()

    def _available_clients(self, s: Session, fed: Federation, spec: FederationSpec) -> list[int]:
        return list(s.scalars(select(Client.id).where(*self._availability(fed, spec))).all())

    def _availability(self, fed: Federation, spec: FederationSpec) -> tuple[Any, ...]:
        """Where-clauses of the clients that count as available now."""
        cutoff = self.clock() - spec.availability_timeout_s
        return (Client.federation_id == fed.id, Client.revoked_at.is_(None), Client.last_seen_at >= cutoff)

    def _start_round(self, s: Session, fed: Federation, number: int, attempt: int) -> Round | None:
        """Open round `number` (attempt `attempt`) with a fresh seeded selection, if enough clients."""
        spec = self.spec_of(fed)
        needed = spec.min_clients if number > 1 else (spec.expected_clients or spec.min_clients)
        # count first: while clients enrol one by one, each enrolment asks and most answers are "not yet"
        available_now = self._availability(fed, spec)
        if s.scalar(select(func.count(Client.id)).where(*available_now)) < needed:
            fed.state = "waiting"
            return None
        available = list(s.scalars(select(Client.id).where(*available_now)).all())
        chosen = select_clients(
            available, spec.num_selected(len(available)), seed=spec.seed, round_number=number, attempt=attempt
        )
        now = self.clock()
        rnd = Round(
            federation_id=fed.id,
            number=number,
            attempt=attempt,
            state="open",
            base_version=number - 1,
            opened_at=now,
            deadline_at=now + spec.round_deadline_s,
            stats={},
        )
        s.add(rnd)
        s.flush()
        s.add_all(Participant(round_id=rnd.id, client_id=cid) for cid in chosen)
        fed.current_round, fed.state, fed.updated_at = number, "running", now
        self._event(
            s,
            fed.id,
            "round_opened",
            f"round {number} attempt {attempt} opened with clients {chosen}",
            number,
        )
        return rnd

    def _next_round(self, s: Session, fed: Federation) -> tuple[int, int]:
        """The round number and attempt to open next."""
        last = s.scalars(
            select(Round)
            .where(Round.federation_id == fed.id)
            .order_by(Round.number.desc(), Round.attempt.desc())
        ).first()
        if last is None:
            return 1, 1
        if last.state == "failed":
            return last.number, last.attempt + 1
        return last.number + 1, 1

    def _advance(self, s: Session, fed: Federation, *, manual: bool) -> Round | None:
        """Open the next round if the federation is due one (caller holds the federation lock)."""
        spec = self.spec_of(fed)
        if fed.state == "completed" or self._open_round(s, fed.id) is not None:
            return None
        if not manual and (fed.paused or not spec.auto_advance):
            fed.state = "paused" if fed.paused else "waiting"
            return None
        number, attempt = self._next_round(s, fed)
        if number > spec.rounds:
            fed.state = "completed"
            return None
        return self._start_round(s, fed, number, attempt)

    def open_round(self, fid: int) -> dict[str, Any]:
        """Operator: open the next round now."""
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            spec = self.spec_of(fed)
            if fed.state == "completed":
                raise Conflict(f"federation {fid} has completed all {spec.rounds} rounds")
            current = self._open_round(s, fid)
            if current is not None:
                raise Conflict(f"round {current.number} is still open; close it first (POST …/close)")
            rnd = self._advance(s, fed, manual=True)
            if rnd is None:
                available = len(self._available_clients(s, fed, spec))
                raise Conflict(
                    f"cannot open a round: {available} client(s) available, the federation needs "
                    f"{spec.min_clients} (min_clients) or {spec.expected_clients} (expected_clients) for round 1; "
                    "enrol more workers"
                )
            rid = rnd.id
        return self.round_detail(fid, rid=rid)

    def close_round(self, fid: int, number: int, *, by: str = "operator") -> dict[str, Any]:
        """Operator: aggregate the open round now with the updates that arrived (at least quorum)."""
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            rnd = self._open_round(s, fid)
            if rnd is None or rnd.number != number:
                raise Conflict(f"round {number} is not open" + (f"; round {rnd.number} is" if rnd else ""))
            spec = self.spec_of(fed)
            n = self._count_updates(s, rnd)
            if n < spec.quorum:
                raise Conflict(f"round {number} has {n} update(s), below the quorum of {spec.quorum}; wait")
            self._aggregate(s, fed, rnd, by=by)
            rid = rnd.id
        return self.round_detail(fid, rid=rid)

    def _count_updates(self, s: Session, rnd: Any) -> int:
        return s.scalar(select(func.count()).select_from(Update).where(Update.round_id == rnd.id)) or 0

    def _aggregate(self, s: Session, fed: Federation, rnd: Round, *, by: str) -> None:
        """Aggregate a round into the next prompt version and open the next round (lock held)."""
        started = time.perf_counter()
        rnd.state = "aggregating"
        spec = self.spec_of(fed)
        updates = s.scalars(
            select(Update)
            .options(defer(Update.blob))
            .where(Update.round_id == rnd.id)
            .order_by(Update.client_id)
        ).all()
        base = s.scalars(
            select(PromptVersion).where(
                PromptVersion.federation_id == fed.id, PromptVersion.version == rnd.base_version
            )
        ).one()
        try:
            if spec.aggregation.name == "fedavg":  # streams: one decoded update in memory at a time
                total = float(sum(u.num_samples for u in updates))
                result = AggregationResult(fedavg_stream(_decoded_updates(s, rnd, canonical=True), total))
            else:
                result = aggregate(
                    spec.aggregation.name,
                    list(_decoded_updates(s, rnd, canonical=False)),
                    params=spec.aggregation.params,
                    global_tensors=wire.decode(base.blob)[0],
                )
            server_step: dict[str, Any] | None = None
            if spec.server_optimizer is not None and spec.server_optimizer.name != "fedavg":
                result, server_step = self._server_step(s, fed.id, rnd, spec.server_optimizer, base, result)
        except AggregationError as exc:
            raise Conflict(f"aggregation failed: {exc}") from None
        version = rnd.number
        blob = wire.encode(
            result.tensors, {"version": str(version), "round": str(rnd.number), "method": spec.method}
        )
        now = self.clock()
        s.add(
            PromptVersion(
                federation_id=fed.id,
                version=version,
                round_id=rnd.id,
                blob=blob,
                sha256=wire.sha256(blob),
                created_at=now,
            )
        )
        participants = s.scalars(select(Participant).where(Participant.round_id == rnd.id)).all()
        samples = sum(u.num_samples for u in updates)
        losses = [
            (u.metrics.get("loss"), u.num_samples) for u in updates if u.metrics.get("loss") is not None
        ]
        stats: dict[str, Any] = {
            "participants": len(participants),
            "updates": len(updates),
            "num_samples": samples,
            "bytes_up": sum(u.size for u in updates),
            "bytes_down": sum(p.downloaded_bytes for p in participants),
            "train_loss": (sum(float(v) * w for v, w in losses) / sum(w for _, w in losses))
            if losses
            else None,
            "notes": {str(updates[i].client_id): note for i, note in result.notes.items()},
            "aggregation_s": time.perf_counter() - started,  # decode, aggregate, encode
        }
        local_asr = {str(u.client_id): u.metrics["local_asr"] for u in updates if "local_asr" in u.metrics}
        if local_asr:  # what malicious clients report of their own prompt
            stats["local_asr"] = local_asr
        if server_step is not None:
            stats["server_optimizer"] = server_step
        if spec.privacy is not None:
            stats["privacy"] = _privacy_record(s, fed.id, spec.privacy, [u.client_id for u in updates])
        rnd.stats = stats  # assigned whole: a JSON column does not track in-place changes
        rnd.state, rnd.result_version, rnd.closed_at, rnd.closed_by = "closed", version, now, by
        fed.latest_version, fed.updated_at = version, now
        self._event(
            s, fed.id, "round_closed", f"round {rnd.number} aggregated {len(updates)} update(s)", rnd.number
        )
        if rnd.number >= spec.rounds:
            fed.state = "completed"
            self._event(s, fed.id, "completed", f"all {spec.rounds} rounds done")
        else:
            fed.state = "waiting"
            self._advance(s, fed, manual=False)

    def _server_step(
        self,
        s: Session,
        fid: int,
        rnd: Round,
        optimizer: ServerOptimizerSpec,
        base: PromptVersion,
        result: AggregationResult,
    ) -> tuple[AggregationResult, dict[str, Any]]:
        """Move the round's base prompt by the server optimiser, the aggregate giving the pseudo-gradient.

        Its state after the base version is read, and the state after this round's version written, in
        the aggregating transaction (federation lock held): it lives only in the database, so it
        survives restarts and every replica steps from the same state. Only the latest state is kept.
        """
        held = s.scalars(
            select(ServerOptimizerState.blob).where(
                ServerOptimizerState.federation_id == fid, ServerOptimizerState.version == rnd.base_version
            )
        ).first()
        state = server_optim.decode_state(held) if held is not None else {}
        x = wire.decode(base.blob)[0]
        step = server_optim.server_step(optimizer.name, x, result.tensors, state, optimizer.params())
        s.execute(
            delete(ServerOptimizerState).where(
                ServerOptimizerState.federation_id == fid, ServerOptimizerState.version < rnd.number
            )
        )
        s.add(
            ServerOptimizerState(
                federation_id=fid,
                version=rnd.number,
                optimizer=optimizer.name,
                blob=server_optim.encode_state(step.state, {"optimizer": optimizer.name}),
                created_at=self.clock(),
            )
        )
        record = {
            "name": optimizer.name,
            **optimizer.params(),
            "step": step.step,  # 1 in round 1; a lower one means the state was missing and restarted
            "pseudo_gradient_norm": server_optim.distance(result.tensors, x),  # ||aggregate - base||
            "update_norm": server_optim.distance(step.tensors, x),  # ||new prompt - base||
        }
        return AggregationResult(step.tensors, result.notes), record

    def sweep(self) -> None:
        """Enforce deadlines, close complete rounds and start due ones (run periodically by every process)."""
        now = self.clock()
        with self.sessions() as s:
            feds = s.scalars(select(Federation).where(Federation.state.in_(("waiting", "running")))).all()
            todo = [(f.id, f.state) for f in feds]
        for fid, state in todo:
            if state == "waiting":
                with self._tx() as s:
                    fed = self._lock_federation(s, fid)
                    if fed.state == "waiting":
                        self._advance(s, fed, manual=False)
                continue
            with self.sessions() as s:
                rnd = self._open_round(s, fid)
                due = rnd is not None and (rnd.deadline_at <= now or self._all_uploaded(s, rnd))
            if due:
                self._close_if_due(fid)

    def _all_uploaded(self, s: Session, rnd: Any) -> bool:
        selected = self._selected.get(rnd.id)  # fixed when the round opens
        if selected is None:
            selected = s.scalar(
                select(func.count()).select_from(Participant).where(Participant.round_id == rnd.id)
            )
            if selected:
                self._selected[rnd.id] = selected
        return bool(selected) and self._count_updates(s, rnd) >= selected

    def _close_if_due(self, fid: int) -> None:
        """Close the open round if everyone uploaded or its deadline passed (fail it below quorum)."""
        with self._tx() as s:
            fed = self._lock_federation(s, fid)
            rnd = self._open_round(s, fid)
            if rnd is None:
                return
            spec = self.spec_of(fed)
            if self._all_uploaded(s, rnd):
                self._aggregate(s, fed, rnd, by="all-uploaded")
            elif rnd.deadline_at <= self.clock():
                n = self._count_updates(s, rnd)
                if n >= spec.quorum:
                    self._aggregate(s, fed, rnd, by="deadline")
                else:
                    rnd.state, rnd.closed_at = "failed", self.clock()
                    rnd.failure_reason = (
                        f"deadline passed with {n} update(s), below the quorum of {spec.quorum}"
                    )
                    self._event(s, fid, "round_failed", rnd.failure_reason, rnd.number)
                    fed.state = "waiting"
                    if not fed.paused:  # retry at once with a fresh selection
                        self._advance(s, fed, manual=True)

    # -- history ------------------------------------------------------------------------------

    def _round_summary(self, s: Session, rnd: Round) -> dict[str, Any]:
        participants = s.scalars(select(Participant).where(Participant.round_id == rnd.id)).all()
        uploaded = set(s.scalars(select(Update.client_id).where(Update.round_id == rnd.id)).all())
        evaluation = self._evaluation_summary(s, rnd.federation_id, rnd.result_version)
        return {
            "round": rnd.number,
            "attempt": rnd.attempt,
            "state": rnd.state,
            "base_version": rnd.base_version,
            "result_version": rnd.result_version,
            "opened_at": rnd.opened_at,
            "deadline_at": rnd.deadline_at,
            "closed_at": rnd.closed_at,
            "closed_by": rnd.closed_by,
            "seconds": (rnd.closed_at - rnd.opened_at) if rnd.closed_at else None,
            "failure_reason": rnd.failure_reason,
            "participants": [
                {"client_id": p.client_id, "uploaded": p.client_id in uploaded} for p in participants
            ],
            "stats": rnd.stats,
            "evaluation": evaluation,
        }

    def _evaluation_summary(self, s: Session, fid: int, version: int | None) -> dict[str, Any] | None:
        if version is None:
            return None
        rows = s.scalars(
            select(Evaluation).where(Evaluation.federation_id == fid, Evaluation.version == version)
        ).all()
        return summarize_evaluations(version, rows)

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        """The round history, every attempt, oldest first."""
        with self.sessions() as s:
            self._federation(s, fid)
            rows = s.scalars(
                select(Round).where(Round.federation_id == fid).order_by(Round.number, Round.attempt)
            ).all()
            return [self._round_summary(s, r) for r in rows]

    def round_detail(self, fid: int, number: int | None = None, *, rid: int | None = None) -> dict[str, Any]:
        """One round (its latest attempt)."""
        with self.sessions() as s:
            self._federation(s, fid)
            q = select(Round).where(Round.federation_id == fid)
            q = q.where(Round.id == rid) if rid is not None else q.where(Round.number == number)
            rnd = s.scalars(q.order_by(Round.attempt.desc())).first()
            if rnd is None:
                raise NotFound(f"round {number} of federation {fid} has not been opened yet")
            return self._round_summary(s, rnd)

    def evaluations(self, fid: int, version: int) -> dict[str, Any] | None:
        """Sample-weighted evaluation of one prompt version."""
        with self.sessions() as s:
            self._federation(s, fid)
            return self._evaluation_summary(s, fid, version)

    def gauge_counts(self) -> dict[str, Any]:
        """Read-only counts for Prometheus gauges: federations and rounds by state, clients per federation."""
        now = self.clock()
        with self.sessions() as s:
            feds = s.execute(select(Federation.id, Federation.state, Federation.spec)).all()
            rounds = dict(s.execute(select(Round.state, func.count()).group_by(Round.state)).all())
            clients = s.execute(select(Client.federation_id, Client.revoked_at, Client.last_seen_at)).all()
        timeout = {fid: float((spec or {}).get("availability_timeout_s") or 600.0) for fid, _, spec in feds}
        per_fed: dict[int, dict[str, int]] = {
            fid: {"enrolled": 0, "revoked": 0, "active": 0} for fid, _, _ in feds
        }
        for fid, revoked_at, last_seen in clients:
            counts = per_fed.setdefault(fid, {"enrolled": 0, "revoked": 0, "active": 0})
            counts["enrolled"] += 1
            if revoked_at is not None:
                counts["revoked"] += 1
            elif now - last_seen <= timeout.get(fid, 600.0):
                counts["active"] += 1
        by_state: dict[str, int] = {}
        for _, state, _ in feds:
            by_state[state] = by_state.get(state, 0) + 1
        return {"federations": by_state, "rounds": rounds, "clients": per_fed}

    def events(self, fid: int, *, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        """The federation's audit trail."""
        with self.sessions() as s:
            self._federation(s, fid)
            rows = s.scalars(
                select(Event)
                .where(Event.federation_id == fid, Event.id > after)
                .order_by(Event.id)
                .limit(limit)
            ).all()
            return [
                {
                    "id": e.id,
                    "kind": e.kind,
                    "round": e.round_number,
                    "message": e.message,
                    "at": e.created_at,
                }
                for e in rows
            ]

    # -- the worker side ----------------------------------------------------------------------

    def get_prompt(self, fid: int, version: str | int, *, client: Client | None = None) -> PromptVersion:
        """A prompt version's blob ('latest' or a number); counts a participant's download."""
        record: int | None = None
        with self.sessions() as s:  # a read; the download is recorded below only when it changes
            fed = self._fed_row(s, fid)
            if version == "latest":
                number = fed.latest_version
            else:
                try:
                    number = int(version)
                except ValueError:
                    raise Invalid(f"version must be a number or 'latest', not '{version}'") from None
                if not 0 <= number <= MAX_ID:
                    raise NotFound(
                        f"prompt version {number} does not exist; the latest is {fed.latest_version}"
                    )
            pv = self._version(s, fed, number)
            if pv is None:
                raise NotFound(f"prompt version {number} does not exist; the latest is {fed.latest_version}")
            if client is not None:
                part = s.execute(
                    select(Participant.id, Participant.downloaded_bytes)
                    .join(Round, Round.id == Participant.round_id)
                    .where(
                        Round.federation_id == fid,
                        Round.state == "open",
                        Round.base_version == number,
                        Participant.client_id == client.id,
                    )
                ).first()
                if part is not None and part.downloaded_bytes != len(pv.blob):
                    record = part.id
        if record is not None:
            with self._tx() as s:
                s.execute(
                    update(Participant).where(Participant.id == record).values(downloaded_bytes=len(pv.blob))
                )
        return pv

    def _cached_stamp(self, fid: int, max_age: float) -> tuple[Any, ...] | None:
        """The federation's change stamp as this process last read it, if younger than max_age (no I/O)."""
        hit = self._stamps.get(fid)
        return hit[1] if hit is not None and time.monotonic() - hit[0] < max_age else None

    def federation_stamp(self, fid: int, max_age: float) -> tuple[Any, ...]:
        """What every client's next task depends on besides its own requests (state, round, version,
        last change), read from the database at most once per max_age by this process: all the
        long-polls waiting on a federation share one query instead of each re-running next_task."""
        with self._stamps_lock:
            stamp = self._cached_stamp(fid, max_age)
            if stamp is None:
                with self.sessions() as s:
                    row = s.execute(
                        select(
                            Federation.state,
                            Federation.current_round,
                            Federation.latest_version,
                            Federation.updated_at,
                        ).where(Federation.id == fid)
                    ).first()
                stamp = tuple(row) if row is not None else ()
                self._stamps[fid] = (time.monotonic(), stamp)
        return stamp

    def next_task(self, fid: int, client: Client) -> dict[str, Any] | None:
        """What this client should do now: evaluate the latest prompt, train for a round, or nothing."""
        with self.sessions() as s:
            c = s.connection()  # plain column reads on the Core connection: no ORM result processing
            fed = self._fed_row(s, fid)
            spec = self._spec(s, fid)
            latest = fed.latest_version
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
                    "sha256": self._version_sha(s, fed, latest),
                }
            rnd = c.execute(
                select(Round.id, Round.number, Round.attempt, Round.base_version, Round.deadline_at).where(
                    Round.federation_id == fid, Round.state == "open"
                )
            ).first()
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
                if pending is not None:
                    return {
                        "kind": "train",
                        "round": rnd.number,
                        "attempt": rnd.attempt,
                        "version": rnd.base_version,
                        "sha256": self._version_sha(s, fed, rnd.base_version),
                        "deadline_at": rnd.deadline_at,
                        "config": {
                            "local_steps": spec.local_steps,
                            "batch_size": spec.batch_size,
                            "lr": spec.lr,
                            "grad_clip": spec.grad_clip,
                            "seed": spec.seed,
                        },
                    }
            if fed.state == "completed":
                return {"kind": "done", "round": fed.current_round, "version": fed.latest_version}
        return None

    def upload(self, fid: int, number: int, client: Client, body: bytes) -> UploadResult:
        """Accept a client's update for a round: validated fully before anything is stored, then
        committed together with the other uploads arriving meanwhile (see _store_updates)."""
        digest = wire.sha256(body)
        spec = self._specs.get(fid)
        if spec is None:
            with self.sessions() as s:
                spec = self._spec(s, fid)
        try:
            tensors, meta = wire.decode_checked(body, spec.tensor_shapes())
        except wire.WireError as exc:
            raise Invalid(str(exc)) from None
        num_samples, metrics = _parse_update_metadata(meta, spec)
        del tensors  # validated; the blob is stored exactly as received
        pending = PendingUpload(
            number, client.id, body, digest, num_samples, metrics, meta.get("base_version")
        )
        batcher = self._uploads.get(fid)
        if batcher is None:
            batcher = self._uploads.setdefault(fid, GroupCommit(functools.partial(self._store_updates, fid)))
        try:
            return batcher.submit(pending)
        except IntegrityError:  # the same client's concurrent upload for this round committed first
            return self._concurrent_upload(fid, number, client, digest)

    def _store_updates(
        self, fid: int, items: Sequence[PendingUpload]
    ) -> list[UploadResult | ServiceError | IntegrityError]:
        """Store a batch of validated updates in one transaction; each item's answer, or why not."""
        try:
            return self._store_update_batch(fid, items)
        except IntegrityError as exc:
            if len(items) == 1:
                return [exc]
        # another process stored an update of one of these clients meanwhile: each on its own,
        # so that only that one answers with the conflict
        out: list[UploadResult | ServiceError | IntegrityError] = []
        for item in items:
            try:
                out.extend(self._store_update_batch(fid, [item]))
            except IntegrityError as exc:
                out.append(exc)
        return out

    def _store_update_batch(
        self, fid: int, items: Sequence[PendingUpload]
    ) -> list[UploadResult | ServiceError]:
        """The checks and inserts of a batch of uploads in one transaction: a handful of column reads
        for the whole batch and one multi-row insert, no ORM objects. On SQLite this transaction
        holds the write lock, so its length bounds how many uploads a second the coordinator takes."""
        with self._tx(urgent=True) as s:
            c = s.connection()  # column reads and a multi-row insert on the Core connection
            current_round = c.scalar(  # FOR SHARE: see _lock_federation
                select(Federation.current_round).where(Federation.id == fid).with_for_update(read=True)
            )
            if current_round is None:
                return [_no_federation(fid) for _ in items]
            attempts: dict[int, list[Any]] = defaultdict(list)  # round number -> attempts, latest first
            for row in c.execute(
                select(Round.id, Round.number, Round.attempt, Round.state, Round.base_version)
                .where(Round.federation_id == fid, Round.number.in_({i.number for i in items}))
                .order_by(Round.number, Round.attempt.desc())
            ):
                attempts[row.number].append(row)
            clients = {i.client_id for i in items}
            round_ids = [r.id for rows in attempts.values() for r in rows]
            stored: dict[tuple[int, int], _Stored] = {
                (row.round_id, row.client_id): _Stored(row.sha256, row.num_samples, row.size)
                for row in c.execute(
                    select(
                        Update.round_id, Update.client_id, Update.sha256, Update.num_samples, Update.size
                    ).where(Update.round_id.in_(round_ids), Update.client_id.in_(clients))
                )
            }
            selected = {
                (row.round_id, row.client_id): row.revoked_at
                for row in c.execute(
                    select(Participant.round_id, Participant.client_id, Client.revoked_at)
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
                    result = _check_update(
                        item, attempts.get(item.number, []), stored, selected, current_round
                    )
                except ServiceError as exc:
                    out.append(exc)
                    continue
                out.append(result)
                if result.created:  # a second upload of the same client in this batch sees this one
                    round_id = attempts[item.number][0].id
                    stored[(round_id, item.client_id)] = _Stored(
                        item.digest, item.num_samples, len(item.body)
                    )
                    rows.append(
                        {
                            "round_id": round_id,
                            "client_id": item.client_id,
                            "blob": item.body,
                            "sha256": item.digest,
                            "num_samples": item.num_samples,
                            "metrics": item.metrics,
                            "size": len(item.body),
                            "created_at": self.clock(),
                        }
                    )
            if rows:
                c.execute(insert(Update), rows)
                for number in {
                    i.number for i, r in zip(items, out, strict=True) if isinstance(r, UploadResult)
                }:
                    if self._all_uploaded(s, attempts[number][0]):
                        out = [
                            dataclasses.replace(r, round_complete=True)
                            if isinstance(r, UploadResult) and r.created and r.round == number
                            else r
                            for r in out
                        ]
        return out

    def _concurrent_upload(self, fid: int, number: int, client: Client, digest: str) -> UploadResult:
        """The answer to an upload that lost the race to an upload of the same client for the same
        round: the same acknowledgement if it carried the same bytes, a conflict otherwise."""
        with self.sessions() as s:
            row = s.execute(
                select(Update, Round.attempt)
                .options(defer(Update.blob))
                .join(Round, Round.id == Update.round_id)
                .where(Round.federation_id == fid, Round.number == number, Update.client_id == client.id)
                .order_by(Round.attempt.desc())
            ).first()
        if row is not None and row[0].sha256 == digest:
            upd, attempt = row
            return UploadResult(False, number, attempt, client.id, digest, upd.num_samples, upd.size)
        raise _no_replacing(client.id, number)

    def after_upload(self, fid: int) -> None:
        """Close the round now if that upload was the last one missing."""
        with self.sessions() as s:  # the upload route calls it when its batch completed the round
            rnd = s.execute(select(Round.id).where(Round.federation_id == fid, Round.state == "open")).first()
            due = rnd is not None and self._all_uploaded(s, rnd)
        if due:
            self._close_if_due(fid)

    def report_evaluation(self, fid: int, version: int, client: Client, payload: dict[str, Any]) -> bool:
        """Store a client's evaluation of a prompt version; a repeat is a no-op. True if stored."""
        try:
            with self._tx() as s:  # column reads and a Core insert: short, like _store_update's
                latest = s.scalar(select(Federation.latest_version).where(Federation.id == fid))
                if latest is None:
                    raise _no_federation(fid)
                if version < 0 or version > latest:
                    raise NotFound(f"prompt version {version} does not exist; the latest is {latest}")
                # re-checked here like an upload's: a client revoked through another process is
                # still in this one's authentication cache, and reports feed the dashboard's accuracy
                if s.scalar(select(Client.revoked_at).where(Client.id == client.id)) is not None:
                    raise Forbidden(f"client {client.id} was revoked by the operator")
                exists = s.scalar(
                    select(Evaluation.id).where(
                        Evaluation.federation_id == fid,
                        Evaluation.version == version,
                        Evaluation.client_id == client.id,
                    )
                )
                if exists is not None:
                    return False
                s.execute(
                    insert(Evaluation).values(
                        federation_id=fid,
                        version=version,
                        client_id=client.id,
                        num_samples=int(payload["num_samples"]),
                        accuracy=float(payload["accuracy"]),
                        loss=None if payload.get("loss") is None else float(payload["loss"]),
                        metrics=payload.get("metrics") or {},
                        created_at=self.clock(),
                    )
                )
        except IntegrityError:  # the same client's concurrent report committed first
            return False
        return True


def _decoded_updates(s: Session, rnd: Round, *, canonical: bool) -> Iterator[tuple[dict[str, Any], float]]:
    """A round's updates decoded one at a time: in content order (canonical) or by client id."""
    order = (Update.num_samples, Update.sha256) if canonical else (Update.client_id,)
    rows = s.execute(
        select(Update.id, Update.num_samples).where(Update.round_id == rnd.id).order_by(*order)
    ).all()
    for start in range(0, len(rows), 64):  # blobs 64 at a time, never the whole round
        chunk = rows[start : start + 64]
        blobs = dict(
            s.execute(select(Update.id, Update.blob).where(Update.id.in_([r[0] for r in chunk]))).all()
        )
        for uid, num_samples in chunk:
            yield wire.decode(blobs.pop(uid))[0], float(num_samples)


def _traffic_per_client(s: Session, fid: int) -> dict[int, dict[str, int]]:
    """Per client: updates stored and their bytes, prompt downloads by participants and their bytes."""
    up = (
        select(Update.client_id, func.count(), func.coalesce(func.sum(Update.size), 0))
        .join(Round, Round.id == Update.round_id)
        .where(Round.federation_id == fid)
        .group_by(Update.client_id)
    )
    down = (
        select(Participant.client_id, func.count(), func.coalesce(func.sum(Participant.downloaded_bytes), 0))
        .join(Round, Round.id == Participant.round_id)
        .where(Round.federation_id == fid, Participant.downloaded_bytes > 0)
        .group_by(Participant.client_id)
    )
    out: dict[int, dict[str, int]] = {}
    for cid, n, size in s.execute(up).all():
        out.setdefault(cid, {"uploads": 0, "bytes_up": 0, "downloads": 0, "bytes_down": 0}).update(
            uploads=int(n), bytes_up=int(size)
        )
    for cid, n, size in s.execute(down).all():
        out.setdefault(cid, {"uploads": 0, "bytes_up": 0, "downloads": 0, "bytes_down": 0}).update(
            downloads=int(n), bytes_down=int(size)
        )
    return out


def _final_version(fed: Any, number: int) -> bool:
    """A prompt version that can no longer change: every one but 0, and 0 once round 1 has opened
    (set_initial_prompt replaces it only before that)."""
    return number > 0 or fed.current_round > 0


def _no_federation(fid: int) -> NotFound:
    return NotFound(f"federation {fid} does not exist; list them with GET /api/v1/federations")


def _no_replacing(client_id: int, number: int) -> Conflict:
    return Conflict(
        f"client {client_id} already uploaded a different update for round {number}; "
        "an update cannot be replaced"
    )


def _check_update(
    item: PendingUpload,
    attempts: list[Any],
    stored: dict[tuple[int, int], _Stored],
    selected: dict[tuple[int, int], float | None],
    current_round: int,
) -> UploadResult:
    """Whether a validated upload may be stored: an UploadResult (created: insert it; not created:
    an identical re-send of an acknowledged upload), or the ServiceError that says why not."""
    number, cid, digest = item.number, item.client_id, item.digest
    if not attempts:
        raise NotFound(f"round {number} has not been opened; the current round is {current_round}")
    for rnd in attempts:  # an identical re-send of an acknowledged upload: same answer
        upd = stored.get((rnd.id, cid))
        if upd is not None and upd.sha256 == digest:
            return UploadResult(False, number, rnd.attempt, cid, digest, upd.num_samples, upd.size)
    current = attempts[0]
    if current.state != "open":
        raise Gone(f"round {number} is {current.state}; the current round is {current_round}")
    if (current.id, cid) in stored:
        raise _no_replacing(cid, number)
    if (current.id, cid) not in selected:
        raise Forbidden(f"client {cid} was not selected for round {number}")
    if selected[(current.id, cid)] is not None:  # revoked by another process, within its auth cache
        raise Forbidden(f"client {cid} was revoked by the operator")
    if item.base_version is not None and item.base_version != str(current.base_version):
        raise Conflict(
            f"update was trained from prompt version {item.base_version}, but round {number} "
            f"starts from version {current.base_version}; download it and train again"
        )
    return UploadResult(True, number, current.attempt, cid, digest, item.num_samples, len(item.body))


def _count_per_client(s: Session, table: type[Participant] | type[Update], fid: int) -> dict[int, int]:
    """Rows of a per-round table (participants, updates) per client of a federation."""
    query = (
        select(table.client_id, func.count())
        .join(Round, Round.id == table.round_id)
        .where(Round.federation_id == fid)
        .group_by(table.client_id)
    )
    return {cid: n for cid, n in s.execute(query).all()}


def _epsilon_spent(s: Session, fid: int, privacy: PrivacySpec) -> dict[int, float]:
    """Each client's cumulative epsilon over every update it sent, whatever the update claims: the
    federation's mechanism composed over that many releases (privacy.spent_epsilon)."""
    return {
        cid: spent_epsilon(privacy.mechanism, privacy.epsilon, privacy.delta, n)
        for cid, n in _count_per_client(s, Update, fid).items()
    }


def _privacy_record(
    s: Session, fid: int, privacy: PrivacySpec, client_ids: list[int] | None = None
) -> dict[str, Any]:
    """The LDP record shown in the status and each round's stats: the mechanism's settings (with the
    Gaussian noise multiplier), each client's cumulative epsilon (only `client_ids` when given) and the largest."""
    spent = _epsilon_spent(s, fid, privacy)
    shown = sorted(spent) if client_ids is None else client_ids
    record: dict[str, Any] = privacy.model_dump()
    if privacy.mechanism == "gaussian":
        assert privacy.delta is not None
        record["noise_multiplier"] = gaussian_noise_multiplier(privacy.epsilon, privacy.delta)
    return record | {
        "cumulative_epsilon": {str(cid): spent.get(cid, 0.0) for cid in shown},
        "max_cumulative_epsilon": max(spent.values(), default=0.0),
    }


def summarize_evaluations(version: int, rows: list[Evaluation] | Any) -> dict[str, Any] | None:
    """Sample-weighted accuracy and loss over the clients that evaluated a version; their confusion
    matrices summed (per-class accuracy and macro-F1) when every report carries one."""
    rows = list(rows)
    if not rows:
        return None
    total = sum(r.num_samples for r in rows)
    if total <= 0:
        return None
    acc = sum(r.accuracy * r.num_samples for r in rows) / total
    with_loss = [r for r in rows if r.loss is not None]
    loss = (
        sum(r.loss * r.num_samples for r in with_loss) / sum(r.num_samples for r in with_loss)
        if with_loss
        else None
    )
    out: dict[str, Any] = {
        "version": version,
        "clients": len(rows),
        "num_samples": total,
        "accuracy": acc,
        "loss": loss,
    }
    out |= evalstats.class_summary(
        evalstats.sum_confusions(evalstats.read_confusion(r.metrics) for r in rows)
    )
    extra_keys = sorted(
        {
            k
            for r in rows
            for k, v in (r.metrics or {}).items()
            if isinstance(v, int | float) and not evalstats.is_class_count(k)
        }
    )
    for key in extra_keys:
        if key.endswith("_samples"):  # the sample count behind another metric: summed, not averaged
            out[key] = sum(int(r.metrics[key]) for r in rows if isinstance(r.metrics.get(key), int | float))
            continue
        # a metric with its own sample count (ASR: non-target examples only) is weighted by it
        vals = [
            (float(r.metrics[key]), max(0.0, float(r.metrics.get(f"{key}_samples", r.num_samples))))
            for r in rows
            if isinstance(r.metrics.get(key), int | float)
        ]
        weight = sum(w for _, w in vals)
        if weight:
            out[key] = sum(v * w for v, w in vals) / weight
    return out


def _finite_number(value: Any) -> bool:
    """A JSON number that is a finite float (not a bool, not an int beyond float's range)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


# An integer as metadata carries it: ASCII digits only (str.isdigit() and int() also take '²', '١'),
# ten at most (ids and counts are 32-bit).
_DECIMAL = re.compile(r"[+-]?[0-9]{1,10}")


def _parse_update_metadata(meta: dict[str, str], spec: FederationSpec) -> tuple[int, dict[str, Any]]:
    """num_samples and metrics from an update's safetensors metadata, checked."""
    if meta.get("format") != wire.FORMAT:
        raise Invalid(f"metadata 'format' must be '{wire.FORMAT}' (got {meta.get('format')!r})")
    method = meta.get("method")
    if method is not None and method != spec.method:
        raise Invalid(f"update was made with method '{method}', the federation uses '{spec.method}'")
    fingerprint = meta.get("model_fingerprint")
    if spec.model_fingerprint and fingerprint and fingerprint != spec.model_fingerprint:
        raise Invalid(
            f"update comes from model {fingerprint}; the federation's model is {spec.model_fingerprint}"
        )
    raw = meta.get("num_samples")
    if raw is None or not _DECIMAL.fullmatch(raw.strip()):
        raise Invalid("metadata 'num_samples' (a positive integer) is required in the safetensors header")
    num_samples = int(raw.strip())
    if num_samples < 1 or num_samples > MAX_ID:
        raise Invalid(f"metadata 'num_samples' must be a positive integer, got {num_samples}")
    metrics: dict[str, Any] = {}
    if "metrics" in meta:
        try:  # bounded: nesting depth and number length (a 5,000-digit number is refused, not parsed)
            metrics = jsonlimits.loads(meta["metrics"], what="metadata 'metrics'")
        except jsonlimits.JSONLimitError as exc:
            raise Invalid(f"metadata 'metrics' must be a JSON object: {exc}") from None
        if not isinstance(metrics, dict) or not all(_finite_number(v) for v in metrics.values()):
            raise Invalid("metadata 'metrics' must be a JSON object of finite numbers")
    return num_samples, metrics


def validate_spec(payload: Any) -> FederationSpec:
    """Parse a federation spec, turning validation errors into one readable 422.

    Strict, as its JSON schema says: a number is not taken from a string, nor an integer or a
    boolean from each other (``"rounds": true`` is refused, not read as 1)."""
    try:
        return FederationSpec.model_validate(payload, strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise Invalid(f"invalid federation spec: {problems}") from None
