"""The coordinator's use cases behind one object: what the routes, the dashboard, the metrics and the
tests call. Each method is one use case's (coordinator/usecases/), all over one Store.

    store.py               transactions, the federation lock, events, caches, change stamps
    usecases/federations   create, initial prompt, pause / resume, spec, export
    usecases/enrolment     enrolment tokens, enrolment, client authentication, revocation, sessions
    usecases/rounds        open, close, sweep, aggregate (rule, server optimiser, round statistics)
    usecases/uploads       updates (checked, clipped, group-committed) and evaluation reports
    usecases/tasks         a client's next task, prompt downloads
    usecases/reads         status, ledger, history, clients, evaluations, events, gauge counts
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fedprompt.coordinator.db import Client, EnrollmentToken, Federation, PromptVersion
from fedprompt.coordinator.logic.uploads import UploadResult
from fedprompt.coordinator.store import Stamp, Store
from fedprompt.coordinator.usecases.enrolment import Enrolment
from fedprompt.coordinator.usecases.federations import Federations
from fedprompt.coordinator.usecases.reads import Reads
from fedprompt.coordinator.usecases.rounds import RoundCycle
from fedprompt.coordinator.usecases.tasks import Tasks
from fedprompt.coordinator.usecases.uploads import Uploads
from fedprompt.shared.spec import FederationSpec
from sqlalchemy.orm import sessionmaker


class Coordinator:
    """The use cases composed over one store; nothing else touches the database."""

    def __init__(
        self,
        sessions: sessionmaker,
        *,
        clock: Callable[[], float] = time.time,
        auth_cache_s: float = 30.0,
        default_round_deadline_s: float | None = None,
        max_prompt_bytes: int | None = None,
    ) -> None:
        self.store = Store(sessions, clock=clock)
        self.reads = Reads(self.store)
        self.cycle = RoundCycle(self.store, self.reads)
        self.federations = Federations(
            self.store,
            self.cycle,
            self.reads,
            default_round_deadline_s=default_round_deadline_s,
            max_prompt_bytes=max_prompt_bytes,
        )
        self.enrolment = Enrolment(self.store, self.cycle, auth_cache_s=auth_cache_s)
        self.uploads = Uploads(self.store)
        self.tasks = Tasks(self.store)

    @property
    def sessions(self) -> sessionmaker:
        return self.store.sessions

    @property
    def clock(self) -> Callable[[], float]:
        """The time every use case reads (tests set a clock they move by hand)."""
        return self.store.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.store.clock = clock

    # -- federations ----------------------------------------------------------------------------

    def create_federation(self, spec: FederationSpec) -> Federation:
        return self.federations.create_federation(spec)

    def set_initial_prompt(self, fid: int, body: bytes) -> PromptVersion:
        return self.federations.set_initial_prompt(fid, body)

    def set_paused(self, fid: int, paused: bool) -> dict[str, Any]:
        return self.federations.set_paused(fid, paused)

    def federation_spec(self, fid: int) -> dict[str, Any]:
        return self.federations.federation_spec(fid)

    def export_prompt(self, fid: int, version: str | int, fmt: str) -> tuple[str, bytes]:
        return self.federations.export_prompt(fid, version, fmt)

    # -- enrolment and clients ------------------------------------------------------------------

    def create_enrollment_token(
        self, fid: int, *, expires_in_s: float | None = None, max_uses: int | None = None
    ) -> tuple[str, EnrollmentToken]:
        return self.enrolment.create_enrollment_token(fid, expires_in_s=expires_in_s, max_uses=max_uses)

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
        return self.enrolment.enroll(
            fid,
            token,
            name=name,
            num_samples=num_samples,
            info=info,
            model_parameters=model_parameters,
            tls_fingerprint=tls_fingerprint,
        )

    def state_model_parameters(self, client: Client, stated: int) -> int | None:
        return self.enrolment.state_model_parameters(client, stated)

    def cached_client(self, token: str) -> Client | None:
        return self.enrolment.cached_client(token)

    def authenticate_client(self, fid: int, token: str) -> Client:
        return self.enrolment.authenticate_client(fid, token)

    def heartbeat_due(self, client: Client) -> bool:
        return self.enrolment.heartbeat_due(client)

    def heartbeat(self, client: Client) -> None:
        self.enrolment.heartbeat(client)

    def revoke_client(self, fid: int, cid: int) -> None:
        self.enrolment.revoke_client(fid, cid)

    def revoke_session(self, session_id: str, expires_at: float) -> None:
        self.enrolment.revoke_session(session_id, expires_at)

    def session_revoked(self, session_id: str) -> bool:
        return self.enrolment.session_revoked(session_id)

    # -- rounds ---------------------------------------------------------------------------------

    def open_round(self, fid: int) -> dict[str, Any]:
        return self.cycle.open_round(fid)

    def close_round(self, fid: int, number: int, *, by: str = "operator") -> dict[str, Any]:
        return self.cycle.close_round(fid, number, by=by)

    def sweep(self) -> None:
        self.cycle.sweep()

    def after_upload(self, fid: int) -> None:
        self.cycle.after_upload(fid)

    # -- the worker side ------------------------------------------------------------------------

    def next_task(self, fid: int, client: Client) -> dict[str, Any] | None:
        return self.tasks.next_task(fid, client)

    def get_prompt(self, fid: int, version: str | int, *, client: Client | None = None) -> PromptVersion:
        return self.tasks.get_prompt(fid, version, client=client)

    def report_activity(self, client: Client, activity: dict[str, Any]) -> None:
        self.enrolment.report_activity(client, activity)

    def get_control(self, fid: int, version: str | int, *, client: Client | None = None) -> bytes:
        return self.tasks.get_control(fid, version, client=client)

    def federation_stamp(self, fid: int, max_age: float) -> Stamp:
        return self.store.federation_stamp(fid, max_age)

    def upload(self, fid: int, number: int, client: Client, body: bytes) -> UploadResult:
        return self.uploads.upload(fid, number, client, body)

    def report_evaluation(self, fid: int, version: int, client: Client, payload: dict[str, Any]) -> bool:
        return self.uploads.report_evaluation(fid, version, client, payload)

    # -- reads ----------------------------------------------------------------------------------

    def list_federations(self) -> list[dict[str, Any]]:
        return self.reads.list_federations()

    def federation_status(self, fid: int) -> dict[str, Any]:
        return self.reads.federation_status(fid)

    def list_clients(self, fid: int) -> list[dict[str, Any]]:
        return self.reads.list_clients(fid)

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        return self.reads.rounds(fid)

    def round_detail(self, fid: int, number: int | None = None, *, rid: int | None = None) -> dict[str, Any]:
        return self.reads.round_detail(fid, number, rid=rid)

    def evaluations(self, fid: int, version: int) -> dict[str, Any] | None:
        return self.reads.evaluations(fid, version)

    def site_evaluations(self, fid: int, version: int) -> dict[str, Any]:
        return self.reads.site_evaluations(fid, version)

    def site_table(self, fid: int) -> dict[str, Any] | None:
        return self.reads.site_table(fid)

    def events(self, fid: int, *, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        return self.reads.events(fid, after=after, limit=limit)

    def gauge_counts(self) -> dict[str, Any]:
        return self.reads.gauge_counts()
