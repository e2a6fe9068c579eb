"""Read models: federation status with its ledger, round history, clients, evaluations, events, and
the counts behind the Prometheus gauges. Nothing here writes."""

from __future__ import annotations

from typing import Any

from fedprompt.coordinator.errors import Forbidden, NotFound
from fedprompt.coordinator.logic import buffered
from fedprompt.coordinator.logic import secagg as secagg_rules
from fedprompt.coordinator.logic.evaluation import site_results, spread, summarize_evaluations
from fedprompt.coordinator.logic.ledger import ledger
from fedprompt.coordinator.logic.roundstats import privacy_record
from fedprompt.coordinator.logic.sites import count_states, site_state
from fedprompt.coordinator.persistence.db import (
    Client,
    Evaluation,
    Event,
    Federation,
    Participant,
    Round,
    SecaggRound,
    Update,
)
from fedprompt.coordinator.persistence.store import Store
from fedprompt.shared.spec import STALE_HEARTBEATS, FederationSpec, heartbeat_interval
from fedprompt.shared.spec_options import PrivacySpec
from fedprompt.shared.vocab import RoundState
from sqlalchemy import func, select
from sqlalchemy.orm import Session


class Reads:
    """What the operator, the dashboard and the metrics read of the federations."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def list_federations(self) -> list[dict[str, Any]]:
        """Status of every federation."""
        with self.store.sessions() as s:
            ids = s.scalars(select(Federation.id).order_by(Federation.id)).all()
        return [self.federation_status(fid) for fid in ids]

    def federation_status(self, fid: int) -> dict[str, Any]:
        """State, round, clients, latest metrics and the communication ledger of one federation (with
        the downloaded bytes this process still holds written first)."""
        self.store.downloads.flush()
        now = self.store.clock()
        with self.store.sessions() as s:
            fed = self.store.federation(s, fid)
            spec = self.store.spec_of(fed)
            clients = s.scalars(select(Client).where(Client.federation_id == fid)).all()
            active = [c for c in clients if c.revoked_at is None]
            available = [c for c in active if now - c.last_seen_at <= spec.availability_timeout_s]
            open_round = self.store.open_round(s, fid)
            latest_closed = s.scalars(
                select(Round)
                .where(Round.federation_id == fid, Round.state == RoundState.CLOSED)
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
                "open_round": self.round_summary(s, open_round) if open_round else None,
                "latest": self.round_summary(s, latest_closed) if latest_closed else None,
                "best_version": self.store.best_version(s, fid),
                "spec": fed.spec,
                "created_at": fed.created_at,
            }
            closed = s.execute(
                select(Round.number, Round.stats)
                .where(Round.federation_id == fid, Round.state == RoundState.CLOSED)
                .order_by(Round.number)
            ).all()
            out["ledger"] = ledger(
                [(n, st or {}) for n, st in closed],
                params_per_client=spec.params_communicated(),
                params_full_model=spec.params_full_model or fed.model_parameters,
                per_client=traffic_per_client(s, fid),
            )
            if spec.buffered:
                out["buffer"] = self.buffer_status(s, fid, spec, open_round, fed.latest_version)
            if spec.privacy is not None:
                out["privacy"] = privacy_of(s, fid, spec.privacy)
            if spec.privacy is not None or spec.secure_aggregation is not None:
                out["privacy_guarantees"] = secagg_rules.guarantees(spec)
        return out

    def round_summary(self, s: Session, rnd: Round) -> dict[str, Any]:
        """One round attempt as the API shows it: timings, participants, stats and evaluation."""
        participants = s.scalars(select(Participant).where(Participant.round_id == rnd.id)).all()
        uploaded = set(s.scalars(select(Update.client_id).where(Update.round_id == rnd.id)).all())
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
            "evaluation": evaluation_summary(s, rnd.federation_id, rnd.result_version),
            **self._secure_stage(s, rnd),
        }

    def _secure_stage(self, s: Session, rnd: Round) -> dict[str, Any]:
        """A secure round attempt's stage and who completed each stage (nothing for other rounds)."""
        if self.store.cached_spec(rnd.federation_id).secure_aggregation is None:
            return {}
        row = s.get(SecaggRound, rnd.id)
        if row is None:
            return {}
        plan = secagg_rules.Plan.from_json(row.plan)
        view = secagg_rules.stage_view(plan, row.stage, row.reached)
        if rnd.state == RoundState.OPEN:  # the running stage's deadline (the round's moves with each stage)
            view |= {"stage_started_at": row.stage_started_at, "stage_deadline_at": rnd.deadline_at}
        return {"secure_aggregation": view}

    def buffer_status(
        self, s: Session, fid: int, spec: FederationSpec, open_round: Round | None, latest: int
    ) -> dict[str, Any]:
        """Mode async: the open buffer's fill, the tasks held against the concurrency, the staleness
        of every update counted so far, and each client's accepted updates and their rate."""
        names = dict(s.execute(select(Client.id, Client.name).where(Client.federation_id == fid)).all())
        counted = (
            select(Update.client_id, Update.staleness, Update.created_at)
            .join(Round, Round.id == Update.buffer_round_id)
            .where(Round.federation_id == fid)
        ).subquery()
        staleness = s.execute(select(counted.c.staleness, func.count()).group_by(counted.c.staleness)).all()
        per_client = s.execute(
            select(
                counted.c.client_id,
                func.count(),
                func.min(counted.c.created_at),
                func.max(counted.c.created_at),
            ).group_by(counted.c.client_id)
        ).all()
        held = self.store.held_tasks(s, fid, spec, latest)
        return {
            "buffer_size": spec.buffer_size,
            "concurrency": spec.concurrency,
            "max_staleness": spec.max_staleness,
            "server_lr": spec.server_lr,
            "open_buffer": None if open_round is None else open_round.number,
            "filled": 0 if open_round is None else self.store.buffer_count(s, open_round.id),
            "tasks_held": len(held),
            "training": sorted(row.client_id for row in held),
            "staleness": buffered.staleness_histogram(t for t, n in staleness for _ in range(n)),
            "clients": [
                {
                    "client_id": cid,
                    "name": names.get(cid, "?"),
                    "updates": n,
                    "updates_per_minute": buffered.throughput(n, first, last),
                }
                for cid, n, first, last in sorted(per_client)
            ],
        }

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        """The round history, every attempt, oldest first."""
        with self.store.sessions() as s:
            self.store.federation(s, fid)
            rows = s.scalars(
                select(Round).where(Round.federation_id == fid).order_by(Round.number, Round.attempt)
            ).all()
            return [self.round_summary(s, r) for r in rows]

    def round_detail(self, fid: int, number: int | None = None, *, rid: int | None = None) -> dict[str, Any]:
        """One round (its latest attempt)."""
        with self.store.sessions() as s:
            self.store.federation(s, fid)
            q = select(Round).where(Round.federation_id == fid)
            q = q.where(Round.id == rid) if rid is not None else q.where(Round.number == number)
            rnd = s.scalars(q.order_by(Round.attempt.desc())).first()
            if rnd is None:
                raise NotFound(f"round {number} of federation {fid} has not been opened yet")
            return self.round_summary(s, rnd)

    def site_evaluations(self, fid: int, version: int) -> dict[str, Any]:
        """Each site's own evaluation of a version and their spread. Under secure aggregation a site's
        figures reveal its label mix, so they are shown only where the spec lets sites report their
        confusion matrices (secure_aggregation.report_confusion)."""
        with self.store.sessions() as s:
            fed = self.store.federation(s, fid)
            spec = self.store.spec_of(fed)
            if spec.secure_aggregation is not None and not spec.secure_aggregation.report_confusion:
                raise Forbidden(
                    f"federation {fid} uses secure aggregation: per-site results are off, since they reveal "
                    "each site's label mix (a federation created with secure_aggregation.report_confusion "
                    "shows them)"
                )
            if not 0 <= version <= fed.latest_version:
                raise NotFound(f"prompt version {version} does not exist; the latest is {fed.latest_version}")
            rows = s.scalars(
                select(Evaluation).where(Evaluation.federation_id == fid, Evaluation.version == version)
            ).all()
            names = dict(s.execute(select(Client.id, Client.name).where(Client.federation_id == fid)).all())
        sites = site_results(rows, names)
        return {"version": version, "sites": sites, "spread": spread(sites)}

    def site_table(self, fid: int, last: int = 6) -> dict[str, Any] | None:
        """The dashboard's site × version table: each site's accuracy on the last `last` evaluated
        versions and their spread per version (None where secure aggregation keeps sites private)."""
        with self.store.sessions() as s:
            fed = self.store.federation(s, fid)
            spec = self.store.spec_of(fed)
            if spec.secure_aggregation is not None and not spec.secure_aggregation.report_confusion:
                return None
            versions = sorted(
                s.scalars(
                    select(Evaluation.version)
                    .where(Evaluation.federation_id == fid)
                    .distinct()
                    .order_by(Evaluation.version.desc())
                    .limit(last)
                ).all()
            )
            rows = s.scalars(
                select(Evaluation).where(Evaluation.federation_id == fid, Evaluation.version.in_(versions))
            ).all()
            names = dict(s.execute(select(Client.id, Client.name).where(Client.federation_id == fid)).all())
        by_version = {v: site_results([r for r in rows if r.version == v], names) for v in versions}
        clients = sorted({r.client_id for r in rows})
        table = [
            {
                "name": names.get(cid, str(cid)),
                "accuracy": [
                    next((x["accuracy"] for x in by_version[v] if x["client_id"] == cid), None)
                    for v in versions
                ],
            }
            for cid in clients
        ]
        return {"versions": versions, "rows": table, "spread": [spread(by_version[v]) for v in versions]}

    def evaluations(self, fid: int, version: int) -> dict[str, Any] | None:
        """Sample-weighted evaluation of one prompt version."""
        with self.store.sessions() as s:
            self.store.federation(s, fid)
            return evaluation_summary(s, fid, version)

    def list_clients(self, fid: int) -> list[dict[str, Any]]:
        """Every client with its activity."""
        now = self.store.clock()
        with self.store.sessions() as s:
            fed = self.store.federation(s, fid)
            spec = self.store.spec_of(fed)
            clients = s.scalars(select(Client).where(Client.federation_id == fid).order_by(Client.id)).all()
            rounds = count_per_client(s, Participant, fid)
            uploads = count_per_client(s, Update, fid)
            open_round = self.store.open_round(s, fid)
        number = open_round.number if open_round is not None else None
        return [
            {
                "id": c.id,
                "name": c.name,
                "num_samples": c.num_samples,
                "enrolled_at": c.enrolled_at,
                "last_seen_at": c.last_seen_at,
                "revoked": c.revoked_at is not None,
                "state": client_state(c, now, spec, number),
                "activity": c.activity,
                "rounds_selected": rounds.get(c.id, 0),
                "updates": uploads.get(c.id, 0),
                "info": c.info,
            }
            for c in clients
        ]

    def events(self, fid: int, *, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        """The federation's audit trail."""
        with self.store.sessions() as s:
            self.store.federation(s, fid)
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

    def gauge_counts(self) -> dict[str, Any]:
        """Read-only counts for Prometheus gauges: federations and rounds by state; per federation its
        clients, sites by state (coordinator/logic/sites.py), current round, latest version and that
        version's accuracy so far, and its collapsed versions."""
        now = self.store.clock()
        with self.store.sessions() as s:
            feds = s.execute(
                select(
                    Federation.id,
                    Federation.state,
                    Federation.spec,
                    Federation.current_round,
                    Federation.latest_version,
                )
            ).all()
            rounds = dict(s.execute(select(Round.state, func.count()).group_by(Round.state)).all())
            clients = s.execute(
                select(Client.federation_id, Client.revoked_at, Client.last_seen_at, Client.activity)
            ).all()
            open_rounds = dict(
                s.execute(
                    select(Round.federation_id, Round.number).where(Round.state == RoundState.OPEN)
                ).all()
            )
            secure = [fid for fid, _, spec, *_ in feds if (spec or {}).get("secure_aggregation")]
            secure_stats = (  # only secure federations' rounds say who dropped where
                s.execute(
                    select(Round.federation_id, Round.stats).where(
                        Round.federation_id.in_(secure),
                        Round.state.in_((RoundState.CLOSED, RoundState.FAILED)),
                    )
                ).all()
                if secure
                else []
            )
            buffered_feds = [fid for fid, _, spec, *_ in feds if (spec or {}).get("mode") == "async"]
            filled = (  # mode async: each open buffer's updates so far
                dict(
                    s.execute(
                        select(Round.federation_id, func.count(Update.id))
                        .join(Update, Update.buffer_round_id == Round.id)
                        .where(Round.federation_id.in_(buffered_feds), Round.state == RoundState.OPEN)
                        .group_by(Round.federation_id)
                    ).all()
                )
                if buffered_feds
                else {}
            )
            staleness = (  # mode async: the updates counted so far, by staleness
                s.execute(
                    select(Round.federation_id, Update.staleness, func.count())
                    .join(Update, Update.buffer_round_id == Round.id)
                    .where(Round.federation_id.in_(buffered_feds))
                    .group_by(Round.federation_id, Update.staleness)
                ).all()
                if buffered_feds
                else []
            )
            collapsed = dict(
                s.execute(
                    select(Event.federation_id, func.count())
                    .where(Event.kind == "version_collapsed")
                    .group_by(Event.federation_id)
                ).all()
            )
            accuracy = dict(
                s.execute(
                    select(
                        Evaluation.federation_id,
                        func.sum(Evaluation.accuracy * Evaluation.num_samples)
                        / func.sum(Evaluation.num_samples),
                    )
                    .join(Federation, Federation.id == Evaluation.federation_id)
                    .where(Evaluation.version == Federation.latest_version, Evaluation.num_samples > 0)
                    .group_by(Evaluation.federation_id)
                ).all()
            )
        timeout = {
            fid: float((spec or {}).get("availability_timeout_s") or 600.0) for fid, _, spec, *_ in feds
        }
        per_fed: dict[int, dict[str, Any]] = {
            fid: {
                "enrolled": 0,
                "revoked": 0,
                "active": 0,
                "sites": count_states([]),
                "current_round": current,
                "latest_version": latest,
                "accuracy": accuracy.get(fid),
                "collapsed": collapsed.get(fid, 0),
                **({"buffer_filled": filled.get(fid, 0), "staleness": {}} if fid in buffered_feds else {}),
            }
            for fid, _, _, current, latest in feds
        }
        for fid, tau, n in staleness:
            per_fed[fid]["staleness"][str(tau)] = n
        states: dict[int, list[str]] = {}  # fid -> its clients' site states
        for fid, revoked_at, last_seen, activity in clients:
            counts = per_fed.get(fid)
            if counts is None:
                continue
            limit = timeout[fid]
            counts["enrolled"] += 1
            if revoked_at is not None:
                counts["revoked"] += 1
            elif now - last_seen <= limit:
                counts["active"] += 1
            state = site_state(
                now=now,
                last_seen_at=last_seen,
                revoked=revoked_at is not None,
                activity=activity,
                open_round=open_rounds.get(fid),
                stale_after_s=STALE_HEARTBEATS * heartbeat_interval(limit),
                availability_timeout_s=limit,
            )
            states.setdefault(fid, []).append(state)
        for fid, seen in states.items():
            per_fed[fid]["sites"] = count_states(seen)
        for fid, stats in secure_stats:  # secure rounds: who dropped at which stage
            dropped = ((stats or {}).get("secure_aggregation") or {}).get("dropped_at") or {}
            if fid in per_fed and dropped:
                tally = per_fed[fid].setdefault("secagg_dropped", {})
                for stage in dropped.values():
                    tally[stage] = tally.get(stage, 0) + 1
        by_state: dict[str, int] = {}
        for _, state, *_ in feds:
            by_state[state] = by_state.get(state, 0) + 1
        return {"federations": by_state, "rounds": rounds, "clients": per_fed}


def evaluation_summary(s: Session, fid: int, version: int | None) -> dict[str, Any] | None:
    """The summary of the clients' reports on a prompt version (None: none yet, or no version)."""
    if version is None:
        return None
    rows = s.scalars(
        select(Evaluation).where(Evaluation.federation_id == fid, Evaluation.version == version)
    ).all()
    return summarize_evaluations(version, rows)


def count_per_client(s: Session, table: type[Participant] | type[Update], fid: int) -> dict[int, int]:
    """Rows of a per-round table (participants, updates) per client of a federation."""
    query = (
        select(table.client_id, func.count())
        .join(Round, Round.id == table.round_id)
        .where(Round.federation_id == fid)
        .group_by(table.client_id)
    )
    return {cid: n for cid, n in s.execute(query).all()}


def privacy_of(
    s: Session, fid: int, privacy: PrivacySpec, client_ids: list[int] | None = None
) -> dict[str, Any]:
    """The federation's LDP record (logic.roundstats.privacy_record) over the updates stored so far."""
    return privacy_record(privacy, count_per_client(s, Update, fid), client_ids)


def traffic_per_client(s: Session, fid: int) -> dict[int, dict[str, int]]:
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


def client_state(c: Client, now: float, spec: FederationSpec, open_round: int | None) -> str:
    """A client's site state (coordinator/logic/sites.py) under its federation's spec."""
    return site_state(
        now=now,
        last_seen_at=c.last_seen_at,
        revoked=c.revoked_at is not None,
        activity=c.activity,
        open_round=open_round,
        stale_after_s=spec.stale_after_s,
        availability_timeout_s=spec.availability_timeout_s,
    )
