"""This process's turn at SQLite's single writer, with uploads ahead of the other writers.

SQLite lets one transaction write at a time; a writer that finds the database locked retries with
sleeps of up to 100 ms. Writers of one process therefore queue here instead, in a lock that also
orders them: an *urgent* writer (an upload, which the round waits for) goes before the others
waiting (evaluation reports, heartbeats, download accounting), which are not on a round's
critical path. Re-entrant, like the RLock it replaces. Postgres needs none of this (row locks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WriteLock:
    """A re-entrant lock whose urgent waiters are served before its other waiters."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._owner: int | None = None
        self._depth = 0
        self._urgent_waiting = 0

    @contextmanager
    def hold(self, *, urgent: bool = False) -> Iterator[None]:
        """Hold the lock for the block; an urgent caller overtakes the non-urgent ones waiting."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
            else:
                self._urgent_waiting += urgent
                try:
                    while self._owner is not None or (not urgent and self._urgent_waiting):
                        self._cond.wait()
                finally:
                    self._urgent_waiting -= urgent
                self._owner, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._cond.notify_all()
