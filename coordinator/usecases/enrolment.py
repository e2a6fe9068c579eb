"""Enrolment and who is asking: enrolment tokens, clients and their tokens, heartbeats, revocation,
and the dashboard sessions ended by their logout."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedprompt.coordinator.errors import Conflict, Forbidden, NotFound, Unauthorized, revoked_client
from fedprompt.coordinator.logic.tokens import hash_token, new_token
from fedprompt.coordinator.persistence.db import Client, EnrollmentToken, Federation, RevokedSession
from fedprompt.coordinator.persistence.groupcommit import GroupCommit, PerFederation
from fedprompt.coordinator.persistence.store import Store
from fedprompt.coordinator.usecases.rounds import RoundCycle
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import FederationState
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

# Past this many cached tokens the authentication cache starts afresh (it holds one entry per client).
AUTH_CACHE_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class PendingEnrolment:
    """One enrolment waiting for its batch's transaction (Enrolment.enroll)."""

    token: str
    client_token: str
    name: str
    num_samples: int
    info: dict[str, Any]
    model_parameters: int | None
    tls_fingerprint: str | None


class Enrolment:
    """Enrolment tokens, client enrolment and authentication, revocation; dashboard sessions."""

    def __init__(self, store: Store, cycle: RoundCycle, *, auth_cache_s: float = 300.0) -> None:
        self.store = store
        self.cycle = cycle
        # token hash -> (monotonic time checked, client): requests of a client within auth_cache_s of
        # its last check skip the lookup. A revocation by this process drops the client's entry at
        # once; one made by another process drops it when its announcement arrives (Postgres NOTIFY:
        # forget_token), or within auth_cache_s if that was missed; and every write re-checks the
        # client's standing in its own transaction whatever the cache says.
        self.auth_cache_s = auth_cache_s
        self._auth: dict[str, tuple[float, Client]] = {}
        self._enrolments: PerFederation[GroupCommit[PendingEnrolment, Client]] = PerFederation(
            GroupCommit, self._enroll_batch
        )

    def create_enrollment_token(
        self, fid: int, *, expires_in_s: float | None = None, max_uses: int | None = None
    ) -> tuple[str, EnrollmentToken]:
        """Issue an enrolment token (shown once); optional expiry and use limit."""
        token = new_token("fpe")
        now = self.store.clock()
        with self.store.tx() as s:
            self.store.federation(s, fid)
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
        self,
        fid: int,
        token: str,
        *,
        name: str,
        num_samples: int,
        info: dict[str, Any],
        model_parameters: int | None = None,
        tls_fingerprint: str | None = None,
    ) -> tuple[Client, str]:
        """Exchange an enrolment token for a client id and a client token (shown once); under mutual
        TLS the client is bound to the fingerprint of the certificate it enrolled with.

        A stated ``model_parameters`` becomes the federation's full-model figure when neither its spec
        (params_full_model) nor an earlier enrolment has set one; a different later figure is ignored
        and noted in the enrolment's event.

        Enrolments arriving together are committed together (group commit, as uploads are): one
        transaction, one lock of the federation, each enrolment still checked and answered on its
        own; nothing is answered before its batch committed."""
        self.store.cached_spec(fid)  # no such federation: NotFound here, before a batcher is made for it
        client_token = new_token("fpc")
        pending = PendingEnrolment(
            token, client_token, name, num_samples, info, model_parameters, tls_fingerprint
        )
        client = self._enrolments[fid].submit(pending)
        # committed: the new client's first requests need no lookup of the token it was just given
        self._remember(client.token_hash, client)
        return client, client_token

    def _enroll_batch(self, fid: int, items: Sequence[PendingEnrolment]) -> list[Client | BaseException]:
        """Enrol a batch in one transaction: each item a new client, or the refusal of its token
        (unknown, expired, used up: Unauthorized) or of its model (Conflict). The round opens, when
        the federation waits for clients, once the batch is in."""
        now = self.store.clock()
        outcomes: list[Client | BaseException] = []
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            spec = self.store.spec_of(fed)
            rows: dict[str, EnrollmentToken | None] = {}  # token hash -> its row, read once a batch
            for item in items:
                digest = hash_token(item.token)
                if digest not in rows:
                    rows[digest] = s.scalars(
                        select(EnrollmentToken).where(
                            EnrollmentToken.token_hash == digest, EnrollmentToken.federation_id == fid
                        )
                    ).first()
                try:
                    outcomes.append(self._admit(rows[digest], spec, fid, item, now))
                except (Unauthorized, Conflict) as exc:
                    outcomes.append(exc)
            admitted = [(item, c) for item, c in zip(items, outcomes, strict=True) if isinstance(c, Client)]
            if not admitted:
                return outcomes
            s.add_all([c for _, c in admitted])
            s.flush()
            for item, client in admitted:
                message = f"client {client.id} '{item.name}' enrolled ({item.num_samples} samples)"
                note = record_model_parameters(fed, spec.params_full_model, item.model_parameters)
                message += f"; {note}" if note else ""
                self.store.event(s, fid, "client_enrolled", message)
            if fed.state == FederationState.WAITING and spec.auto_advance:
                self.cycle.advance(s, fed, manual=False)
        return outcomes

    @staticmethod
    def _admit(
        row: EnrollmentToken | None, spec: FederationSpec, fid: int, item: PendingEnrolment, now: float
    ) -> Client:
        """The new client of one enrolment, its token's use counted; or the refusal to raise."""
        if row is None:
            raise Unauthorized(
                f"unknown enrolment token for federation {fid}; ask the operator for a new one"
            )
        if row.expires_at is not None and now > row.expires_at:
            raise Unauthorized("this enrolment token has expired; ask the operator for a new one")
        if row.max_uses is not None and row.uses >= row.max_uses:
            raise Unauthorized(f"this enrolment token is used up ({row.max_uses} uses); ask for a new one")
        fingerprint = item.info.get("model_fingerprint")
        if spec.model_fingerprint and fingerprint and fingerprint != spec.model_fingerprint:
            raise Conflict(
                f"your model's fingerprint {fingerprint} differs from the federation's "
                f"{spec.model_fingerprint}; load the model '{spec.model}'"
            )
        row.uses += 1
        return Client(
            federation_id=fid,
            name=item.name,
            token_hash=hash_token(item.client_token),
            num_samples=item.num_samples,
            info=item.info,
            enrolled_at=now,
            last_seen_at=now,
            tls_fingerprint=item.tls_fingerprint,
            revoked_at=None,  # loaded, not expired: the authentication cache reads it
        )

    def state_model_parameters(self, client: Client, stated: int) -> int | None:
        """A worker's model size stated once it has loaded the model: kept as at enrolment (first figure
        wins, the spec's figure first of all); the federation's figure. Writes only while none is known."""
        fid = client.federation_id
        with self.store.sessions() as s:
            fed = self.store.federation(s, fid)
            known = self.store.spec_of(fed).params_full_model or fed.model_parameters
        if known is not None:
            return known
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            self.store.require_active(s, client.id)
            spec = self.store.spec_of(fed)
            note = record_model_parameters(fed, spec.params_full_model, stated)
            if note:
                self.store.event(s, fid, "model_parameters", f"client {client.id} '{client.name}': {note}")
            return spec.params_full_model or fed.model_parameters

    def cached_client(self, token: str) -> Client | None:
        """The client of a token checked within the last auth_cache_s seconds, if any (no I/O)."""
        hit = self._auth.get(hash_token(token))
        return hit[1] if hit is not None and time.monotonic() - hit[0] < self.auth_cache_s else None

    def authenticate_client(self, fid: int, token: str) -> Client:
        """The client owning a bearer token in this federation (read-only: refusals change nothing)."""
        client = self.cached_client(token)
        if client is None:
            digest = hash_token(token)
            with self.store.sessions() as s:
                client = s.scalars(select(Client).where(Client.token_hash == digest)).first()
            if client is not None and client.revoked_at is None:
                self._remember(digest, client)
        if client is None:
            raise Unauthorized("unknown client token; enrol again with an enrolment token")
        if client.federation_id != fid:
            raise Forbidden(f"this client token belongs to federation {client.federation_id}, not {fid}")
        if client.revoked_at is not None:
            raise revoked_client(client.id)
        return client

    def _remember(self, digest: str, client: Client) -> None:
        """Cache an active client under its token's digest (see __init__)."""
        if self.auth_cache_s > 0:
            if len(self._auth) >= AUTH_CACHE_MAX_ENTRIES:
                self._auth.clear()
            self._auth[digest] = (time.monotonic(), client)

    def heartbeat_due(self, client: Client) -> bool:
        """Whether a poll should record the client as seen (not when it was, moments ago: availability
        is judged in minutes, so the write transaction is spared)."""
        interval = self.store.heartbeat_interval(client.federation_id)
        return not 0 <= self.store.clock() - client.last_seen_at < interval

    def heartbeat(self, client: Client) -> None:
        """Record that a client is alive (its task poll); unseen clients are not selected."""
        if not self.heartbeat_due(client):
            return
        now = self.store.clock()
        with self.store.tx() as s:
            s.execute(
                update(Client)
                .where(Client.id == client.id, Client.revoked_at.is_(None))
                .values(last_seen_at=now)
            )
        client.last_seen_at = now  # the cached copy too, so the next polls skip the write

    def report_activity(self, client: Client, activity: dict[str, Any]) -> None:
        """Record a worker's heartbeat: seen now, doing this (its own transaction re-checks that the
        client is not revoked)."""
        now = self.store.clock()
        with self.store.tx() as s:
            self.store.require_active(s, client.id)
            s.execute(
                update(Client)
                .where(Client.id == client.id)
                .values(last_seen_at=now, activity={**activity, "at": now})
            )
        client.last_seen_at = now

    def revoke_client(self, fid: int, cid: int) -> None:
        """Revoke a client: its token stops working and it is never selected again."""
        with self.store.tx() as s:
            self.store.lock_federation(s, fid)
            client = s.get(Client, cid)
            if client is None or client.federation_id != fid:
                raise NotFound(f"client {cid} is not enrolled in federation {fid}")
            if client.revoked_at is None:
                client.revoked_at = self.store.clock()
                self.store.event(s, fid, "client_revoked", f"client {cid} revoked")
            token_hash = client.token_hash
            self.store.announce_revocation(s, token_hash)  # to the other replicas, on commit
        self._auth.pop(token_hash, None)

    def forget_token(self, token_hash: str | None) -> None:
        """Another process revoked the client of this token hash (None: announcements may have been
        missed, forget every cached token): its next request is checked against the database."""
        if token_hash is None:
            self._auth.clear()
        else:
            self._auth.pop(token_hash, None)

    # -- dashboard sessions ---------------------------------------------------------------------

    def revoke_session(self, session_id: str, expires_at: float) -> None:
        """Record a dashboard session as ended (its logout), so that no replica accepts its cookie
        again; records of sessions past their expiry are dropped meanwhile (they are refused anyway)."""
        now = self.store.clock()
        digest = hash_token(session_id)
        try:
            with self.store.tx() as s:
                s.execute(delete(RevokedSession).where(RevokedSession.expires_at < now))
                if s.scalar(select(RevokedSession.id).where(RevokedSession.session_hash == digest)) is None:
                    s.add(RevokedSession(session_hash=digest, expires_at=expires_at, revoked_at=now))
        except IntegrityError:  # the same session's concurrent logout recorded it first
            pass

    def session_revoked(self, session_id: str) -> bool:
        """Whether a dashboard session was ended by its logout (one indexed read)."""
        with self.store.sessions() as s:
            digest = hash_token(session_id)
            return (
                s.scalar(select(RevokedSession.id).where(RevokedSession.session_hash == digest)) is not None
            )


def record_model_parameters(fed: Federation, from_spec: int | None, stated: int | None) -> str:
    """Keep a worker's stated model size as the federation's when none is known yet (the first figure
    wins); what the enrolment's event adds about it: recorded, ignored as different, or nothing."""
    known = from_spec or fed.model_parameters
    if stated is None or stated == known:
        return ""
    if known is None:
        fed.model_parameters = stated
        return f"its model's {stated:,} parameters recorded as the federation's"
    return f"its model's {stated:,} parameters differ from the federation's {known:,} (ignored)"
