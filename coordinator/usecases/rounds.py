"""Rounds: opened with a seeded selection, closed when complete or at the deadline, aggregated into
the next prompt version (the rule, then the server optimiser's step), failed below the quorum.

Every method that changes a round holds the federation's lock (Store.lock_federation) for its
whole transaction, so each round is opened, aggregated and closed exactly once across processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from fedprompt.coordinator.errors import Conflict
from fedprompt.coordinator.logic import buffered, server_optim
from fedprompt.coordinator.logic.aggregation import (
    AggregationError,
    AggregationResult,
    aggregate,
    fedavg_stream,
)
from fedprompt.coordinator.logic.round_states import (
    ROUND_START,
    FederationEvent,
    RoundEvent,
    federation_after,
    round_after,
)
from fedprompt.coordinator.logic.roundstats import round_stats
from fedprompt.coordinator.logic.selection import select_clients
from fedprompt.coordinator.logic.uploads import declared_samples
from fedprompt.coordinator.persistence.db import (
    Client,
    Federation,
    Participant,
    PromptVersion,
    Round,
    ServerOptimizerState,
    Update,
)
from fedprompt.coordinator.persistence.store import Store
from fedprompt.coordinator.usecases.reads import Reads, privacy_of
from fedprompt.coordinator.usecases.secagg import SecureRounds
from fedprompt.shared import drift, wire
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import ServerOptimizerSpec
from fedprompt.shared.vocab import AggregationRule, FederationState, RoundState, ServerOptimizer
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, defer


class RoundCycle:
    """Opening, closing, aggregating and failing rounds; the periodic sweep of deadlines."""

    def __init__(self, store: Store, reads: Reads) -> None:
        self.store = store
        self.reads = reads
        self.secure = SecureRounds(store)

    # -- operator -------------------------------------------------------------------------------

    def open_round(self, fid: int) -> dict[str, Any]:
        """Operator: open the next round now."""
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            spec = self.store.spec_of(fed)
            if fed.state == FederationState.COMPLETED:
                raise Conflict(f"federation {fid} has completed all {spec.rounds} rounds")
            current = self.store.open_round(s, fid)
            if current is not None:
                raise Conflict(f"round {current.number} is still open; close it first (POST …/close)")
            rnd = self.advance(s, fed, manual=True)
            if rnd is None:
                raise Conflict(self._not_enough_clients(s, fed, spec))
            rid = rnd.id
        return self.reads.round_detail(fid, rid=rid)

    def close_round(self, fid: int, number: int, *, by: str = "operator") -> dict[str, Any]:
        """Operator: aggregate the open round now with the updates that arrived (at least quorum)."""
        self.store.downloads.flush()  # the round's traffic counts read them
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            rnd = self.store.open_round(s, fid)
            if rnd is None or rnd.number != number:
                raise Conflict(f"round {number} is not open" + (f"; round {rnd.number} is" if rnd else ""))
            spec = self.store.spec_of(fed)
            if spec.secure_aggregation is not None:
                raise Conflict(
                    f"round {number} uses secure aggregation: it closes when its unmasking stage completes "
                    "or fails at a stage's deadline"
                )
            n = self.store.buffer_count(s, rnd.id) if spec.buffered else self.store.count_updates(s, rnd.id)
            if n < spec.quorum:
                raise Conflict(f"round {number} has {n} update(s), below the quorum of {spec.quorum}; wait")
            self._aggregate(s, fed, rnd, by=by)
            rid = rnd.id
        return self.reads.round_detail(fid, rid=rid)

    # -- automatic ------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Enforce deadlines, close complete rounds and start due ones (run periodically by every process);
        write the downloaded bytes this process holds."""
        self.store.downloads.flush()
        now = self.store.clock()
        with self.store.sessions() as s:
            live = (FederationState.WAITING, FederationState.RUNNING)
            feds = s.scalars(select(Federation).where(Federation.state.in_(live))).all()
            todo = [(f.id, f.state) for f in feds]
        for fid, state in todo:
            if state == FederationState.WAITING:
                with self.store.tx() as s:
                    fed = self.store.lock_federation(s, fid)
                    if fed.state == FederationState.WAITING:
                        self.advance(s, fed, manual=False)
                continue
            with self.store.sessions() as s:
                rnd = self.store.open_round(s, fid)
                due = rnd is not None and self._due(s, rnd, self.store.spec(s, fid), now)
            if due:
                self._close_if_due(fid)
        for fid, _ in todo:
            self._report_stale(fid, now)

    def _report_stale(self, fid: int, now: float) -> None:
        """One 'client_stale' event per silence of a site (coordinator/logic/sites.py): a client not
        revoked, silent past stale_after_s and within the availability timeout, not yet reported for
        this last-seen time (the mark is kept in its activity, so every replica reports it once)."""
        with self.store.sessions() as s:
            spec = self.store.spec(s, fid)
            low, high = now - spec.availability_timeout_s, now - spec.stale_after_s
            silent = s.execute(
                select(Client.id, Client.last_seen_at, Client.activity).where(
                    Client.federation_id == fid,
                    Client.revoked_at.is_(None),
                    Client.last_seen_at < high,
                    Client.last_seen_at >= low,
                )
            ).all()
        todo = [c for c in silent if (c.activity or {}).get("stale_reported_for") != c.last_seen_at]
        if not todo:
            return
        with self.store.tx() as s:
            self.store.lock_federation(s, fid)  # one report across replicas sweeping at once
            for cid in [c.id for c in todo]:
                client = s.get(Client, cid)
                said = dict(client.activity or {}) if client is not None else {}
                if client is None or said.get("stale_reported_for") == client.last_seen_at:
                    continue
                if client.last_seen_at >= high:  # heard from since the read above
                    continue
                doing = (
                    f"; last heartbeat: training round {said.get('round')}, step {said.get('step')} of "
                    f"{said.get('total_steps')}"
                    if said.get("phase") == "training"
                    else ""
                )
                self.store.event(
                    s,
                    fid,
                    "client_stale",
                    f"client {client.id} '{client.name}' silent for {now - client.last_seen_at:.0f} s "
                    f"(stale after {spec.stale_after_s:.0f} s){doing}",
                    said.get("round") if said.get("phase") == "training" else None,
                )
                client.activity = {**said, "stale_reported_for": client.last_seen_at}

    def after_upload(self, fid: int) -> None:
        """Close the round now if that upload was the last one missing."""
        with self.store.sessions() as s:  # the upload route calls it when its batch completed the round
            rnd = s.execute(
                select(Round.id).where(Round.federation_id == fid, Round.state == RoundState.OPEN)
            ).first()
            spec = self.store.spec(s, fid)
            secure = spec.secure_aggregation is not None  # its stages decide
            due = rnd is not None and (secure or self._due(s, rnd, spec, None))
        if due:
            self._close_if_due(fid)

    def _due(self, s: Session, rnd: Any, spec: FederationSpec, now: float | None) -> bool:
        """Whether the open round should be looked at now: its buffer is full (mode async), or every
        selected client uploaded or its deadline passed (`now`; None: the deadline is not asked)."""
        if spec.buffered:
            assert spec.buffer_size is not None
            return self.store.buffer_count(s, rnd.id) >= spec.buffer_size
        return (now is not None and rnd.deadline_at <= now) or self.store.all_uploaded(s, rnd)

    def buffer_full(self, s: Session, fed: Federation, round_id: int) -> None:
        """Mode async: write the version of the open buffer (round id) that the caller's upload just
        filled, in the caller's transaction (federation lock held), and open the next buffer."""
        rnd = s.get(Round, round_id)
        assert rnd is not None and rnd.state == RoundState.OPEN
        self._aggregate(s, fed, rnd, by="buffer-full")

    def advance(self, s: Session, fed: Federation, *, manual: bool) -> Round | None:
        """Open the next round if the federation is due one (caller holds the federation lock)."""
        spec = self.store.spec_of(fed)
        if fed.state == FederationState.COMPLETED or self.store.has_open_round(s, fed.id):
            return None
        if not manual and (fed.paused or not spec.auto_advance):
            fed.state = federation_after(
                fed.state, FederationEvent.PAUSE if fed.paused else FederationEvent.WAIT
            )
            return None
        number, attempt = self._next_round(s, fed)
        if number > spec.rounds:
            fed.state = federation_after(fed.state, FederationEvent.COMPLETE)
            return None
        return self._start_round(s, fed, number, attempt)

    def _not_enough_clients(self, s: Session, fed: Federation, spec: FederationSpec) -> str:
        """Why the next round cannot open: the clients it needs, those enrolled and those available."""
        number = self._next_round(s, fed)[0]
        expected = spec.expected_clients if number == 1 else None  # the first round's own figure, if set
        needed, rule = (
            (expected, "expected_clients") if expected is not None else (spec.min_clients, "min_clients")
        )
        enrolled = (
            s.scalar(
                select(func.count(Client.id)).where(
                    Client.federation_id == fed.id, Client.revoked_at.is_(None)
                )
            )
            or 0
        )
        available = s.scalar(select(func.count(Client.id)).where(*self._availability(fed, spec))) or 0
        advice = (
            f"enrol {needed - enrolled} more worker(s)"
            if enrolled < needed
            else "start the enrolled workers (a client is available once it has polled within "
            f"{spec.availability_timeout_s:g} s)"
        )
        return (
            f"cannot open round {number}: it needs {needed} available client(s) ({rule}); {enrolled} enrolled, "
            f"{available} available; {advice}"
        )

    def _availability(self, fed: Federation, spec: FederationSpec) -> tuple[Any, ...]:
        """Where-clauses of the clients that count as available now."""
        cutoff = self.store.clock() - spec.availability_timeout_s
        return (Client.federation_id == fed.id, Client.revoked_at.is_(None), Client.last_seen_at >= cutoff)

    def _start_round(self, s: Session, fed: Federation, number: int, attempt: int) -> Round | None:
        """Open round `number` (attempt `attempt`) with a fresh seeded selection, if enough clients."""
        spec = self.store.spec_of(fed)
        if spec.buffered and number > 1:  # the next buffer opens at once; its clients come as they ask
            return self._open(s, fed, spec, number, attempt, [])
        needed = spec.min_clients if number > 1 else (spec.expected_clients or spec.min_clients)
        # count first: while clients enrol one by one, each enrolment asks and most answers are "not yet"
        available_now = self._availability(fed, spec)
        if (s.scalar(select(func.count(Client.id)).where(*available_now)) or 0) < needed:
            fed.state = federation_after(fed.state, FederationEvent.WAIT)
            return None
        if spec.buffered:
            return self._open(s, fed, spec, number, attempt, [])
        available = list(s.scalars(select(Client.id).where(*available_now)).all())
        chosen = select_clients(
            available, spec.num_selected(len(available)), seed=spec.seed, round_number=number, attempt=attempt
        )
        return self._open(s, fed, spec, number, attempt, chosen)

    def _open(
        self, s: Session, fed: Federation, spec: FederationSpec, number: int, attempt: int, chosen: list[int]
    ) -> Round:
        """Write the round's row and its selection (none in mode async: a buffer's clients are those
        handed a task while it is open, coordinator/usecases/tasks.py)."""
        now = self.store.clock()
        rnd = Round(
            federation_id=fed.id,
            number=number,
            attempt=attempt,
            state=ROUND_START,
            base_version=number - 1,
            opened_at=now,
            deadline_at=now + spec.round_deadline_s,
            stats={},
        )
        s.add(rnd)
        s.flush()
        s.add_all(Participant(round_id=rnd.id, client_id=cid) for cid in chosen)
        if spec.secure_aggregation is not None:
            self.secure.start(s, spec, rnd, chosen)
        fed.current_round, fed.updated_at = number, now
        fed.state = federation_after(fed.state, FederationEvent.OPEN_ROUND)
        message = (
            f"buffer {number} opened: version {number} is written once {spec.buffer_size} update(s) arrived"
            if spec.buffered
            else f"round {number} attempt {attempt} opened with clients {chosen}"
        )
        self.store.event(s, fed.id, "round_opened", message, number)
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
        if last.state == RoundState.FAILED:
            return last.number, last.attempt + 1
        return last.number + 1, 1

    def _close_if_due(self, fid: int) -> None:
        """Close the open round if everyone uploaded or its deadline passed (fail it below quorum)."""
        self.store.downloads.flush()  # the round's traffic counts read them
        with self.store.tx() as s:
            fed = self.store.lock_federation(s, fid)
            rnd = self.store.open_round(s, fid)
            if rnd is None:
                return
            spec = self.store.spec_of(fed)
            if spec.secure_aggregation is not None:
                outcome = self.secure.progress(s, fed, rnd, spec)
                if outcome.action == "next":
                    try:
                        self._aggregate(s, fed, rnd, by="unmasked")
                    except Conflict as exc:  # shares that do not reconstruct: retried like a failed round
                        self._fail(s, fed, rnd, exc.detail)
                elif outcome.action == "fail":
                    self._fail(s, fed, rnd, outcome.reason)
            elif spec.buffered:  # a buffer never fails: it waits for its updates
                if self._due(s, rnd, spec, None):
                    self._aggregate(s, fed, rnd, by="buffer-full")
            elif self.store.all_uploaded(s, rnd):
                self._aggregate(s, fed, rnd, by="all-uploaded")
            elif rnd.deadline_at <= self.store.clock():
                n = self.store.count_updates(s, rnd.id)
                if n >= spec.quorum:
                    self._aggregate(s, fed, rnd, by="deadline")
                else:
                    self._fail(
                        s, fed, rnd, f"deadline passed with {n} update(s), below the quorum of {spec.quorum}"
                    )

    def secure_stage(self, fid: int, number: int, client: Client, stage: str, payload: Any) -> dict[str, Any]:
        """A client's keys, envelopes or revealed shares for a secure round; then the round moves on as
        far as the answers allow (next stage, aggregation, or failure)."""
        answer = self.secure.post(fid, number, client, stage, payload)
        if answer["stored"]:
            self._close_if_due(fid)
        return answer

    def _fail(self, s: Session, fed: Federation, rnd: Round, reason: str) -> None:
        """Fail the round attempt and retry it at once with a fresh selection (lock held)."""
        secure = self.store.spec_of(fed).secure_aggregation is not None
        rnd.state = round_after(rnd.state, RoundEvent.FAIL, secure=secure)
        rnd.closed_at, rnd.failure_reason = self.store.clock(), reason
        self.store.event(s, fed.id, "round_failed", rnd.failure_reason, rnd.number)
        fed.state = federation_after(fed.state, FederationEvent.END_ROUND)
        if not fed.paused:  # retry at once with a fresh selection
            self.advance(s, fed, manual=True)

    # -- aggregation ----------------------------------------------------------------------------

    def _aggregate(self, s: Session, fed: Federation, rnd: Round, *, by: str) -> None:
        """Aggregate a round into the next prompt version and open the next round (lock held)."""
        started = time.perf_counter()
        spec = self.store.spec_of(fed)
        secure_round = spec.secure_aggregation is not None
        rnd.state = round_after(rnd.state, RoundEvent.AGGREGATE, secure=secure_round)
        counted = Update.buffer_round_id == rnd.id if spec.buffered else Update.round_id == rnd.id
        updates = s.scalars(
            select(Update).options(defer(Update.blob)).where(counted).order_by(Update.client_id)
        ).all()
        base = s.scalars(
            select(PromptVersion).where(
                PromptVersion.federation_id == fed.id, PromptVersion.version == rnd.base_version
            )
        ).one()
        declared: dict[int, int] = {}  # client id -> the num_samples its update's metadata declares
        controls: list[dict[str, np.ndarray]] | None = [] if spec.scaffold else None  # SCAFFOLD's Δc_i
        secure: dict[str, Any] | None = None
        try:
            if secure_round:
                tensors, secure = self.secure.aggregate(s, spec, rnd, wire.decode(base.blob)[0])
                result = AggregationResult(tensors)
            elif spec.buffered:
                current = wire.decode(base.blob)[0]
                rebased = list(buffered_updates(s, fed.id, rnd, current, declared=declared))
                if spec.aggregation.name == AggregationRule.FEDAVG:
                    result = AggregationResult(fedavg_stream(iter(rebased), sum(w for _, w in rebased)))
                else:
                    result = aggregate(
                        spec.aggregation.name, rebased, params=spec.aggregation.params, global_tensors=current
                    )
                assert spec.server_lr is not None
                result = AggregationResult(
                    buffered.server_move(current, result.tensors, spec.server_lr), result.notes
                )
            elif (
                spec.aggregation.name == AggregationRule.FEDAVG
            ):  # streams: one decoded update in memory at a time
                total = float(sum(u.num_samples for u in updates))
                decoded = decoded_updates(s, rnd, canonical=True, declared=declared, controls=controls)
                result = AggregationResult(fedavg_stream(decoded, total))
            else:
                result = aggregate(
                    spec.aggregation.name,
                    list(decoded_updates(s, rnd, canonical=False, declared=declared)),
                    params=spec.aggregation.params,
                    global_tensors=wire.decode(base.blob)[0],
                )
            server_step: dict[str, Any] | None = None
            optimizer = spec.server_optimizer
            if (optimizer is not None and optimizer.name != ServerOptimizer.FEDAVG) or controls is not None:
                result, server_step = self._server_step(s, fed.id, rnd, optimizer, base, result, controls)
        except AggregationError as exc:
            raise Conflict(f"aggregation failed: {exc}") from None
        version = rnd.number
        blob = wire.encode(
            result.tensors, {"version": str(version), "round": str(rnd.number), "method": spec.method}
        )
        now = self.store.clock()
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
        downloads = s.scalars(
            select(Participant.downloaded_bytes).where(Participant.round_id == rnd.id)
        ).all()
        privacy = None
        if spec.privacy is not None:
            privacy = privacy_of(s, fed.id, spec.privacy, [u.client_id for u in updates])
        # assigned whole: a JSON column does not track in-place changes
        rnd.stats = round_stats(
            updates,
            downloads,
            notes=result.notes,
            declared=declared,
            aggregation_s=time.perf_counter() - started,  # decode, aggregate, encode
            server_optimizer=server_step,
            privacy=privacy,
        )
        if secure is not None:
            rnd.stats = {**rnd.stats, "secure_aggregation": secure}
        if spec.buffered:
            taus = [u.staleness or 0 for u in updates]
            rnd.stats = {
                **rnd.stats,
                "buffer": {
                    "updates": len(updates),
                    "buffer_size": spec.buffer_size,
                    "staleness": buffered.staleness_histogram(taus),
                    "mean_staleness": sum(taus) / len(taus) if taus else 0.0,
                    "server_lr": spec.server_lr,
                },
            }
        rnd.state = round_after(rnd.state, RoundEvent.CLOSE, secure=secure_round)
        rnd.result_version, rnd.closed_at, rnd.closed_by = version, now, by
        fed.latest_version, fed.updated_at = version, now
        message = (
            f"buffer {rnd.number} aggregated {len(updates)} update(s) into version {version}"
            if spec.buffered
            else f"round {rnd.number} aggregated {len(updates)} update(s)"
        )
        self.store.event(s, fed.id, "round_closed", message, rnd.number)
        if rnd.number >= spec.rounds:
            fed.state = federation_after(fed.state, FederationEvent.COMPLETE)
            self.store.event(s, fed.id, "completed", f"all {spec.rounds} rounds done")
        else:
            fed.state = federation_after(fed.state, FederationEvent.END_ROUND)
            self.advance(s, fed, manual=False)

    def _server_step(
        self,
        s: Session,
        fid: int,
        rnd: Round,
        optimizer: ServerOptimizerSpec | None,
        base: PromptVersion,
        result: AggregationResult,
        controls: list[dict[str, np.ndarray]] | None,
    ) -> tuple[AggregationResult, dict[str, Any] | None]:
        """Move the round's base prompt by the server optimiser, the aggregate giving the pseudo-gradient,
        and with SCAFFOLD move the server's control variate by the round's Δc_i.

        The state after the base version (the optimiser's moments, and SCAFFOLD's c under 'control/')
        is read, and the state after this round's version written, in the aggregating transaction
        (federation lock held): it lives only in the database, so it survives restarts and every
        replica steps from the same state. Only the latest state is kept.
        """
        held = s.scalars(
            select(ServerOptimizerState.blob).where(
                ServerOptimizerState.federation_id == fid, ServerOptimizerState.version == rnd.base_version
            )
        ).first()
        state, control = drift.split(server_optim.decode_state(held) if held is not None else {})
        x = wire.decode(base.blob)[0]
        tensors, new_state, record = result.tensors, {}, None
        if optimizer is not None and optimizer.name != ServerOptimizer.FEDAVG:
            step = server_optim.server_step(optimizer.name, x, result.tensors, state, optimizer.params())
            tensors, new_state = step.tensors, step.state
            record = {
                "name": optimizer.name,
                **optimizer.params(),
                "step": step.step,  # 1 in round 1; a lower one means the state was missing and restarted
                "pseudo_gradient_norm": server_optim.distance(result.tensors, x),  # ||aggregate - base||
                "update_norm": server_optim.distance(step.tensors, x),  # ||new prompt - base||
            }
        if controls is not None:
            enrolled = s.scalar(
                select(func.count())
                .select_from(Client)
                .where(Client.federation_id == fid, Client.revoked_at.is_(None))
            )
            before = control or drift.zeros({n: np.shape(a) for n, a in x.items()})
            try:
                after = drift.server_control(before, controls, max(int(enrolled or 0), len(controls)))
            except drift.DriftError as exc:
                raise AggregationError(str(exc)) from None
            new_state = {**new_state, **drift.prefixed(after)}
        name = optimizer.name if optimizer is not None else ServerOptimizer.FEDAVG
        s.execute(
            delete(ServerOptimizerState).where(
                ServerOptimizerState.federation_id == fid, ServerOptimizerState.version < rnd.number
            )
        )
        s.add(
            ServerOptimizerState(
                federation_id=fid,
                version=rnd.number,
                optimizer=name,
                blob=server_optim.encode_state(new_state, {"optimizer": name}),
                created_at=self.store.clock(),
            )
        )
        return AggregationResult(tensors, result.notes), record


def buffered_updates(
    s: Session, fid: int, rnd: Round, current: dict[str, np.ndarray], *, declared: dict[int, int]
) -> Iterator[tuple[dict[str, Any], float]]:
    """Mode async: a buffer's updates, each rebased onto the version the buffer builds on (its change
    from its own base, down-weighted by its staleness: coordinator/logic/buffered.py), weighted by its
    stored num_samples, in content order. The base versions are decoded once each."""
    rows = s.execute(
        select(Update.id, Update.client_id, Update.num_samples, Update.staleness, Round.base_version)
        .join(Round, Round.id == Update.round_id)
        .where(Update.buffer_round_id == rnd.id)
        .order_by(Update.num_samples, Update.sha256)
    ).all()
    bases: dict[int, dict[str, np.ndarray]] = {rnd.base_version: current}
    for uid, cid, num_samples, tau, base_version in rows:
        if base_version not in bases:
            blob = s.scalars(
                select(PromptVersion.blob).where(
                    PromptVersion.federation_id == fid, PromptVersion.version == base_version
                )
            ).one()
            bases[base_version] = wire.decode(blob)[0]
        tensors, meta = wire.decode(s.scalars(select(Update.blob).where(Update.id == uid)).one())
        claimed = declared_samples(meta)
        if claimed is not None:
            declared[cid] = claimed
        yield buffered.rebase(current, bases[base_version], tensors, int(tau or 0)), float(num_samples)


def decoded_updates(
    s: Session,
    rnd: Round,
    *,
    canonical: bool,
    declared: dict[int, int],
    controls: list[dict[str, np.ndarray]] | None = None,
) -> Iterator[tuple[dict[str, Any], float]]:
    """A round's updates decoded one at a time, weighted by their stored num_samples: in content order
    (canonical) or by client id. Each one's declared num_samples is put in `declared` by client, and
    with `controls` (SCAFFOLD) its control-variate change is put there and left out of the prompt."""
    order = (Update.num_samples, Update.sha256) if canonical else (Update.client_id,)
    rows = s.execute(
        select(Update.id, Update.client_id, Update.num_samples)
        .where(Update.round_id == rnd.id)
        .order_by(*order)
    ).all()
    for start in range(0, len(rows), 64):  # blobs 64 at a time, never the whole round
        chunk = rows[start : start + 64]
        blobs = dict(
            s.execute(select(Update.id, Update.blob).where(Update.id.in_([r[0] for r in chunk]))).all()
        )
        for uid, cid, num_samples in chunk:
            tensors, meta = wire.decode(blobs.pop(uid))
            if controls is not None:
                tensors, control = drift.split(tensors)
                controls.append(control)
            claimed = declared_samples(meta)
            if claimed is not None:
                declared[cid] = claimed
            yield tensors, float(num_samples)
