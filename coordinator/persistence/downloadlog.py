"""Participants' downloaded bytes, written behind the downloads.

Each download of a round's base version by one of its participants used to be its own writing
transaction: a thousand of them queued for SQLite's single writer beside the uploads while a round
opens. A download acknowledges nothing to the client, so its figure can wait a moment: here it is
held in memory and written with the others in one transaction, by the request that finds the
oldest held figure older than FLUSH_AFTER_S (or FLUSH_AT figures held), and by every sweep, round
close and traffic read of this process (`flush`). A figure only ever grows. A crash loses at
most the figures of the last FLUSH_AFTER_S seconds, which only the ledger's traffic counts read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from fedprompt.coordinator.persistence.db import Participant
from sqlalchemy import bindparam, update
from sqlalchemy.orm import Session

FLUSH_AFTER_S = 0.5
FLUSH_AT = 256

_GROW = (
    update(Participant)
    .where(Participant.id == bindparam("pid"), Participant.downloaded_bytes < bindparam("size"))
    .values(downloaded_bytes=bindparam("size"))
)


class DownloadLog:
    """Participant id -> downloaded bytes not written yet; `flush` writes them in one transaction."""

    def __init__(
        self,
        tx: Callable[[], AbstractContextManager[Session]],
        *,
        flush_after_s: float = FLUSH_AFTER_S,
        flush_at: int = FLUSH_AT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tx, self._clock = tx, clock
        self.flush_after_s, self.flush_at = flush_after_s, flush_at
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self._since: float | None = None  # when the oldest held figure arrived

    def record(self, participant_id: int, size: int, *, write: bool = True) -> None:
        """Hold a participant's figure (the larger of two), and write what is held once it is due
        (`write=False`: never here, e.g. on the event loop; a later record or flush writes it)."""
        with self._lock:
            if size > self._held.get(participant_id, 0):
                self._held[participant_id] = size
            if self._since is None:
                self._since = self._clock()
            due = self._due()
        if due and write:
            self.flush()

    def due_with(self, participant_id: int) -> bool:
        """Whether holding a figure of this participant would make the held ones due for writing."""
        with self._lock:
            return participant_id not in self._held and len(self._held) + 1 >= self.flush_at or self._due()

    def _due(self) -> bool:
        return len(self._held) >= self.flush_at or (
            self._since is not None and self._clock() - self._since >= self.flush_after_s
        )

    def pending(self) -> int:
        """How many figures are held, not written yet."""
        with self._lock:
            return len(self._held)

    def flush(self) -> None:
        """Write every held figure (the ones that grow a participant's) in one transaction."""
        with self._lock:
            held, self._held, self._since = self._held, {}, None
        if not held:
            return
        try:
            with self._tx() as s:
                s.connection().execute(_GROW, [{"pid": pid, "size": size} for pid, size in held.items()])
        except BaseException:  # keep them for the next flush rather than lose them
            with self._lock:
                for pid, size in held.items():
                    if size > self._held.get(pid, 0):
                        self._held[pid] = size
                if self._since is None:
                    self._since = self._clock()
            raise
