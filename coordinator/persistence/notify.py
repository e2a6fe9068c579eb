"""Announcements between coordinator processes sharing one Postgres database (LISTEN/NOTIFY).

A transaction that changes a federation's row sends `NOTIFY fedprompt_federation_changed, '<id>'`
(Store._note_changes; Postgres delivers it only if the transaction commits). Each process holds one
connection listening on that channel, in a thread of its own, and hands every announcement to
`Store.changed`: the long-polls waiting on that federation look at its stamp at once instead of at
their next interval. An announcement missed while the connection was down costs one interval
(the readers keep reading every interval); after reconnecting, every federation is announced, in
case one changed meanwhile. SQLite has no replicas: one process, whose own commits are announced
in-process.

A revocation sends `NOTIFY fedprompt_client_revoked, '<token hash>'` (Store.announce_revocation):
every other process drops that token from its authentication cache, so a revoked client is refused
everywhere as soon as the announcement arrives, not only once the cache's entry expires; after a
reconnection every cached token is dropped, in case a revocation was missed.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable

import psycopg
from fedprompt.coordinator.persistence.store import CHANNEL, REVOKED
from sqlalchemy.engine import URL

log = logging.getLogger("fedprompt.coordinator")

EVERY = -1  # passed to on_change after a reconnection: any federation may have changed


def conninfo(url: URL) -> str:
    """A libpq URI for psycopg from the engine's SQLAlchemy URL (its driver name dropped)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class ChangeListener:
    """A thread that LISTENs for announced federation changes and calls `on_change(fid)`."""

    def __init__(
        self,
        url: URL,
        on_change: Callable[[int], None],
        *,
        on_revoked: Callable[[str | None], None] | None = None,
        poll_s: float = 1.0,
        retry_s: float = 1.0,
    ) -> None:
        self._conninfo, self._on_change, self._on_revoked = conninfo(url), on_change, on_revoked
        self.poll_s, self.retry_s = poll_s, retry_s
        self._stop = threading.Event()
        self._listening = threading.Event()
        # this listener's own channel: stop() notifies it so that a wait on the connection ends at
        # once instead of at the end of its poll interval (a shutdown no longer waits poll_s)
        self._wake = f"fedprompt_wake_{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self._run, name="fedprompt-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._listening.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=2) as conn:
                    conn.execute("SELECT pg_notify(%s, '')", [self._wake])
            except psycopg.Error:
                pass  # the thread still ends within its poll interval
        self._thread.join(timeout)

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                name = f"fedprompt-listen-{os.getpid()}"  # which process's it is, in pg_stat_activity
                with psycopg.connect(self._conninfo, autocommit=True, application_name=name) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f"LISTEN {REVOKED}")
                    conn.execute(f"LISTEN {self._wake}")
                    self._listening.set()
                    if not first:  # announcements may have been missed while it was down
                        self._on_change(EVERY)
                        if self._on_revoked is not None:
                            self._on_revoked(None)
                    first = False
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=self.poll_s):
                            if note.channel == self._wake:
                                break
                            if note.channel == REVOKED:
                                if self._on_revoked is not None:
                                    self._on_revoked(note.payload)
                            else:
                                self._announce(note.payload)
            except psycopg.Error as exc:
                if self._stop.is_set():
                    break
                log.warning(
                    "the change announcements' connection failed (%s); reconnecting", type(exc).__name__
                )
            self._stop.wait(self.retry_s)

    def _announce(self, payload: str) -> None:
        try:
            fid = int(payload)
        except ValueError:
            return  # not ours
        self._on_change(fid)
