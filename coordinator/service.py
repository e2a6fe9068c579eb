"""The coordinator's use cases wired over one Store: `Coordinator` builds each use case
(coordinator/usecases/) once, and the routes, the dashboard, the metrics and the tests call them
through its attributes (`service.cycle.close_round(...)`, `service.reads.rounds(fid)`, ...).

    .store        store.py               transactions, the federation lock, events, caches, change stamps
    .federations  usecases/federations   create, initial prompt, pause / resume, spec, export
    .enrolment    usecases/enrolment     enrolment tokens, enrolment, client authentication, revocation, sessions
    .cycle        usecases/rounds        open, close, sweep, aggregate (rule, server optimiser, round statistics)
    .uploads      usecases/uploads       updates (checked, clipped, group-committed) and evaluation reports
    .tasks        usecases/tasks         a client's next task, prompt downloads
    .reads        usecases/reads         status, ledger, history, clients, evaluations, events, gauge counts
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fedprompt.coordinator.persistence.store import Store
from fedprompt.coordinator.usecases.enrolment import Enrolment
from fedprompt.coordinator.usecases.federations import Federations
from fedprompt.coordinator.usecases.reads import Reads
from fedprompt.coordinator.usecases.rounds import RoundCycle
from fedprompt.coordinator.usecases.tasks import Tasks
from fedprompt.coordinator.usecases.uploads import Uploads
from sqlalchemy.orm import sessionmaker


class Coordinator:
    """The use cases composed over one store; nothing else touches the database."""

    def __init__(
        self,
        sessions: sessionmaker,
        *,
        clock: Callable[[], float] = time.time,
        auth_cache_s: float = 300.0,
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
        self.tasks = Tasks(self.store)
        self.uploads = Uploads(
            self.store,
            on_buffer_full=self.cycle.buffer_full,
            on_report=self.tasks.learn_report,
            on_upload=self.tasks.learn_upload,
        )

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
