"""Prometheus metrics of the coordinator.

Each app owns a ``CollectorRegistry`` (tests build several apps in one process). Counters and
histograms count what *this process* saw: requests it served, uploads it answered, round
transitions it committed. Several coordinator processes can share one database, so sum counters
over processes (``sum by (state) (fedprompt_rounds_total)``). The gauges under ``fedprompt_db_*``
and the client gauges are read from the database at scrape time, so they are global: every
process reports the same values.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

from fedprompt.coordinator.errors import (
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    ServiceError,
    TooLarge,
    Unauthorized,
)
from fedprompt.coordinator.hosting.paths import UPLOAD_ROUTE
from fedprompt.coordinator.persistence.db import Round
from fedprompt.shared.vocab import RoundState
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, sessionmaker
from starlette.routing import Match, Mount

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("fedprompt.rounds")

UNMATCHED = "<unmatched>"
# No `_created` series beside every counter and histogram (a timestamp per label set, which
# Prometheus does not need and which doubles the scrape's series).
disable_created_metrics()
# the committed states of a round (aggregating lasts only inside the transaction that closes it)
ROUND_STATES = (RoundState.OPEN, RoundState.CLOSED, RoundState.FAILED)
_ERRORS: tuple[type[ServiceError], ...] = (
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    Gone,
    TooLarge,
    Invalid,
)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# The upload route's refusals, named after the ServiceError class that produces each status.
REJECTION_REASONS: dict[int, str] = {cls.status: _snake(cls.__name__) for cls in _ERRORS}


def rejection_reason(status: int) -> str:
    """The reason label of a refused upload, from its HTTP status (e.g. 410 → 'gone')."""
    if status in REJECTION_REASONS:
        return REJECTION_REASONS[status]
    return "server_error" if status >= 500 else f"http_{status}"


def route_template(scope: Scope) -> str:
    """The matched route's path template (bounded label values), or '<unmatched>'. FastAPI's own
    routes put themselves in the scope; Starlette's (the OpenAPI document, mounted static files) do
    not, so they are matched here against the application's routes."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    app = scope.get("app")
    for candidate in getattr(app, "routes", ()):
        try:
            match, _ = candidate.matches(scope)
        except Exception:  # a route that cannot read this scope is not the one
            continue
        if match is Match.FULL:
            if isinstance(candidate, Mount):
                return f"{candidate.path}/{{path}}"
            return str(getattr(candidate, "path", UNMATCHED))
    return UNMATCHED


@dataclass(frozen=True)
class RoundTransition:
    """A round attempt that reached a state, as committed."""

    federation_id: int
    round: int
    attempt: int
    state: str
    opened_at: float
    closed_at: float | None
    closed_by: str | None
    failure_reason: str | None

    @property
    def seconds(self) -> float | None:
        """How long the attempt was open (None while it is open)."""
        return None if self.closed_at is None else self.closed_at - self.opened_at


class DatabaseGauges(Collector):
    """Gauges computed at scrape time from the database: global across coordinator processes."""

    def __init__(self, counts: Callable[[], dict[str, Any]]) -> None:
        self.counts = counts

    def describe(self) -> list[Metric]:
        """The gauges' names, without touching the database (called at registration)."""
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        """Read the counts; a failing database yields fedprompt_database_up 0 and no other gauge."""
        try:
            counts = self.counts()
        except Exception:  # a scrape must not fail because the DB is down: report it instead
            logging.getLogger("fedprompt.metrics").warning("database gauges unavailable", exc_info=True)
            up = GaugeMetricFamily("fedprompt_database_up", "1 if the database answered the scrape.")
            up.add_metric([], 0)
            yield up
            return
        yield from self._families(counts)

    @staticmethod
    def _families(counts: dict[str, Any] | None = None) -> Iterator[Metric]:
        up = GaugeMetricFamily("fedprompt_database_up", "1 if the database answered the scrape.")
        feds = GaugeMetricFamily(
            "fedprompt_db_federations", "Federations by state (database; all processes).", labels=["state"]
        )
        rounds = GaugeMetricFamily(
            "fedprompt_db_rounds", "Round attempts by state (database; all processes).", labels=["state"]
        )
        # one value per federation: (name, help, the value from its counts; None leaves it out)
        per_federation: list[tuple[str, str, Callable[[dict[str, Any]], float | None]]] = [
            (
                "fedprompt_active_clients",
                "Clients not revoked that polled within the federation's availability_timeout_s.",
                lambda c: c["active"],
            ),
            (
                "fedprompt_enrolled_clients",
                "Clients ever enrolled, revoked included.",
                lambda c: c["enrolled"],
            ),
            ("fedprompt_revoked_clients", "Revoked clients.", lambda c: c["revoked"]),
            (
                "fedprompt_stale_clients",
                "Clients not revoked, silent past the federation's stale_after_s (three heartbeats) but "
                "within its availability timeout: dead, hung or cut off.",
                lambda c: c["sites"]["stale"],
            ),
            (
                "fedprompt_current_round",
                "The federation's current round number.",
                lambda c: c["current_round"],
            ),
            (
                "fedprompt_latest_version",
                "The federation's latest prompt version.",
                lambda c: c["latest_version"],
            ),
            (
                "fedprompt_latest_accuracy",
                "Sample-weighted accuracy of the latest version over the clients that reported it so far.",
                lambda c: c["accuracy"],
            ),
            (
                "fedprompt_buffer_updates",
                "Mode async: updates in the open buffer so far (a version is written at buffer_size).",
                lambda c: c.get("buffer_filled"),
            ),
            (
                "fedprompt_collapsed_versions",
                "Prompt versions whose clients' evaluations, summed, show a constant predictor "
                "(a 'version_collapsed' event).",
                lambda c: c["collapsed"],
            ),
        ]
        singles = [GaugeMetricFamily(name, doc, labels=["federation"]) for name, doc, _ in per_federation]
        # one value per federation and state (site) or stage (secure aggregation's drops)
        sites = GaugeMetricFamily(
            "fedprompt_sites",
            "Clients by site state: live, training, stale, gone, revoked (docs/dashboard.md).",
            labels=["federation", "state"],
        )
        staleness = GaugeMetricFamily(
            "fedprompt_buffered_updates",
            "Mode async: updates counted in a buffer so far, by their staleness (versions behind).",
            labels=["federation", "staleness"],
        )
        secagg_dropped = GaugeMetricFamily(
            "fedprompt_secagg_dropped",
            "Clients that dropped out of a finished secure round attempt, by the stage they did not complete.",
            labels=["federation", "stage"],
        )
        if counts is not None:
            up.add_metric([], 1)
            for state, n in sorted(counts["federations"].items()):
                feds.add_metric([state], n)
            for state in sorted({*ROUND_STATES, RoundState.AGGREGATING, *counts["rounds"]}):
                rounds.add_metric([state], counts["rounds"].get(state, 0))
            for fid, c in sorted(counts["clients"].items()):
                for family, (_, _, value_of) in zip(singles, per_federation, strict=True):
                    value = value_of(c)
                    if value is not None:
                        family.add_metric([str(fid)], float(value))
                for state, n in c["sites"].items():
                    sites.add_metric([str(fid), state], n)
                for stage, n in sorted(c.get("secagg_dropped", {}).items()):
                    secagg_dropped.add_metric([str(fid), stage], n)
                for tau, n in sorted(c.get("staleness", {}).items(), key=lambda kv: int(kv[0])):
                    staleness.add_metric([str(fid), tau], n)
        yield from (up, feds, rounds, *singles, sites, staleness, secagg_dropped)


class CoordinatorMetrics:
    """The coordinator's Prometheus metrics (own registry) and per-client refusal tallies."""

    def __init__(self, counts: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        for standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):  # process_*, python_*
            r.register(standard)
        self.rounds = Counter(
            "fedprompt_rounds",
            "Round attempts that reached a state (open, closed, failed), committed by this process.",
            ["state"],
            registry=r,
        )
        self.round_seconds = Histogram(
            "fedprompt_round_duration_seconds",
            "Seconds from a round attempt's opening to its closing or failure (this process closed it).",
            ["outcome"],
            buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600),
            registry=r,
        )
        self.uploads = Counter(
            "fedprompt_uploads",
            "Uploads answered with 2xx by this process: accepted (201) or identical re-send (200).",
            ["result"],
            registry=r,
        )
        self.rejections = Counter(
            "fedprompt_upload_rejections",
            "Uploads refused by this process, by reason.",
            ["reason"],
            registry=r,
        )
        self.upload_bytes = Counter(
            "fedprompt_upload_bytes", "Body bytes of uploads accepted by this process.", registry=r
        )
        self.bytes_in = Counter(
            "fedprompt_http_received_bytes", "Request body bytes received, by route.", ["route"], registry=r
        )
        self.bytes_out = Counter(
            "fedprompt_http_sent_bytes", "Response body bytes sent, by route.", ["route"], registry=r
        )
        self.latency = Histogram(
            "fedprompt_http_request_duration_seconds",
            "Request latency by method, route template and status (long-polls included).",
            ["method", "route", "status"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        for state in ROUND_STATES:
            self.rounds.labels(state)
        for result in ("accepted", "duplicate"):
            self.uploads.labels(result)
        for reason in REJECTION_REASONS.values():
            self.rejections.labels(reason)
        if counts is not None:
            r.register(DatabaseGauges(counts))
        self._lock = threading.Lock()
        self._refused: Tally[tuple[int, int]] = Tally()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def round_transition(self, t: RoundTransition) -> None:
        """Count a committed round transition and observe the attempt's duration when it ends."""
        if t.state not in ROUND_STATES:
            return
        self.rounds.labels(t.state).inc()
        if t.seconds is not None and t.state in (RoundState.CLOSED, RoundState.FAILED):
            self.round_seconds.labels(t.state).observe(max(t.seconds, 0.0))

    def observe_request(
        self, method: str, route: str, status: int, seconds: float, received: int, sent: int, scope: Scope
    ) -> None:
        """Record one served request: latency, bytes, and for the upload route its outcome."""
        self.latency.labels(method, route, str(status)).observe(seconds)
        if received:
            self.bytes_in.labels(route).inc(received)
        if sent:
            self.bytes_out.labels(route).inc(sent)
        if route != UPLOAD_ROUTE or method != "PUT":
            return
        if status == 201:
            self.uploads.labels("accepted").inc()
            self.upload_bytes.inc(received)
        elif status == 200:
            self.uploads.labels("duplicate").inc()
        elif status >= 400:
            self.rejections.labels(rejection_reason(status)).inc()
            fid = (scope.get("path_params") or {}).get("fid")
            cid = (scope.get("state") or {}).get("client_id")
            if fid is not None and cid is not None:
                with self._lock:
                    self._refused[(int(fid), int(cid))] += 1

    def refused_uploads(self, fid: int) -> dict[int, int]:
        """Refused uploads per client of a federation, as seen by this process."""
        with self._lock:
            return {cid: n for (f, cid), n in self._refused.items() if f == fid}


_PENDING = "fedprompt_round_transitions"


def _transition(rnd: Round) -> RoundTransition:
    return RoundTransition(
        federation_id=rnd.federation_id,
        round=rnd.number,
        attempt=rnd.attempt,
        state=rnd.state,
        opened_at=rnd.opened_at,
        closed_at=rnd.closed_at,
        closed_by=rnd.closed_by,
        failure_reason=rnd.failure_reason,
    )


def log_transition(t: RoundTransition) -> None:
    """One structured log line per committed round transition."""
    if t.state not in ROUND_STATES:
        return
    names: dict[str, str] = {
        RoundState.OPEN: "round_opened",
        RoundState.CLOSED: "round_closed",
        RoundState.FAILED: "round_failed",
    }
    name = names[t.state]
    fields: dict[str, Any] = {
        "federation_id": t.federation_id,
        "round": t.round,
        "attempt": t.attempt,
    }
    if t.seconds is not None:
        fields["seconds"] = round(t.seconds, 3)
    if t.closed_by:
        fields["closed_by"] = t.closed_by
    if t.failure_reason:
        fields["failure_reason"] = t.failure_reason
    log.info(name, extra=fields)


def instrument_sessions(sessions: sessionmaker, on_commit: Callable[[RoundTransition], None]) -> None:
    """Report every round transition committed through these sessions (rolled-back ones are dropped)."""

    @event.listens_for(sessions, "after_flush")
    def _collect(session: Session, _ctx: Any) -> None:
        pending: list[RoundTransition] = session.info.setdefault(_PENDING, [])
        for obj in session.new:
            if isinstance(obj, Round):
                pending.append(_transition(obj))
        for obj in session.dirty:
            if isinstance(obj, Round) and inspect(obj).attrs.state.history.added:
                pending.append(_transition(obj))

    @event.listens_for(sessions, "after_commit")
    def _report(session: Session) -> None:
        for t in session.info.pop(_PENDING, []):
            on_commit(t)

    @event.listens_for(sessions, "after_rollback")
    def _drop(session: Session) -> None:
        session.info.pop(_PENDING, None)


class MetricsMiddleware:
    """Pure ASGI middleware: latency by route template, body bytes in/out, upload outcomes."""

    def __init__(self, app: ASGIApp, metrics: CoordinatorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request and record it, also when the app raises."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen = {"in": 0, "out": 0, "status": 500}
        finished: list[float] = []  # when the last body byte left: background tasks run after it

        async def counting_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen["in"] += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = int(message["status"])
            elif message["type"] == "http.response.body":
                seen["out"] += len(message.get("body", b""))
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                finished.append(time.perf_counter())

        asked = {**scope}  # as it came: routing rewrites root_path on the way down
        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            self.metrics.observe_request(
                scope.get("method", "GET"),
                route_template({**asked, "route": scope.get("route"), "app": scope.get("app")}),
                seen["status"],
                (finished[0] if finished else time.perf_counter()) - start,
                seen["in"],
                seen["out"],
                scope,
            )
