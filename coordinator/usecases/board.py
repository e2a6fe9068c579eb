"""What a task poll knows without asking the database: the clients that found nothing under the
federation's current change stamp (IdleClients), and the federation's board of tasks read once per
change (Board). Tasks (tasks.py) keeps and uses both."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fedprompt.coordinator.persistence.store import Stamp


class IdleClients:
    """Per federation, the clients whose next task was nothing under the federation's current change
    stamp (Store.federation_stamp). Every change that can give a client a task moves the stamp (a
    round opening or retried, a version made, a secure round's next stage, the federation's state)
    and is announced (Store.changed: this process's commits, other processes' through NOTIFY), which
    drops the federation's marks, so until then such a client's poll is answered without a query.
    The clients' own writes come after the tasks that asked for them, never after a poll that found
    nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marks: dict[int, tuple[Stamp, set[int]]] = {}  # fid -> (stamp, idle client ids)
        self._generation: dict[int, int] = {}  # fid -> announced changes so far

    def generation(self, fid: int) -> int:
        """Read before a query whose answer may be marked: a change announced meanwhile voids the mark."""
        with self._lock:
            return self._generation.get(fid, 0)

    def idle(self, fid: int, stamp: Stamp, client_id: int) -> bool:
        with self._lock:
            held = self._marks.get(fid)
            return held is not None and held[0] == stamp and client_id in held[1]

    def mark(self, fid: int, stamp: Stamp, client_id: int, generation: int) -> None:
        with self._lock:
            if self._generation.get(fid, 0) != generation:  # a change was announced since the query
                return
            held = self._marks.get(fid)
            if held is None or held[0] != stamp:  # a new stamp: the marks of the last one no longer hold
                held = self._marks[fid] = (stamp, set())
            held[1].add(client_id)

    def forget(self, fid: int) -> None:
        """A change of the federation was announced: no mark of it holds any more."""
        with self._lock:
            self._generation[fid] = self._generation.get(fid, 0) + 1
            self._marks.pop(fid, None)


@dataclass
class Board:
    """What every client's next task of one federation depends on, read once per change stamp: the
    open round and the train task it hands out (the same for every selected client), the evaluate
    task of the latest version when one is due, the federation's clients in enrolment order, and
    who had uploaded or reported when it was read. A poll looks its client up here; a task found is
    confirmed by one query of that client's own rows before it is handed out (an upload or report
    through this or another process since the board was read), and the board learns the answer."""

    stamp: Stamp
    generation: int
    round_id: int | None
    round_number: int | None
    attempt: int | None
    base_version: int | None
    train: dict[str, Any] | None
    participants: dict[int, int]  # client id -> its participant row of the open round
    uploaded: set[int]
    evaluate: dict[str, Any] | None
    latest: int
    evaluated: set[int]
    evaluators: int | None
    ranks: dict[int, int]  # client id -> clients enrolled before it and not revoked
    done: dict[str, Any] | None
