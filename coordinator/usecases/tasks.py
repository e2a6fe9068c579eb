"""What a worker is asked to do and given: its next task, and the prompt versions it downloads."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from fedprompt.coordinator.errors import Gone, NotFound
from fedprompt.coordinator.logic import server_optim
from fedprompt.coordinator.logic.evaluation import asked_to_evaluate, evaluation_due
from fedprompt.coordinator.persistence.db import (
    Client,
    Evaluation,
    Participant,
    PromptVersion,
    Round,
    ServerOptimizerState,
    Update,
)
from fedprompt.coordinator.persistence.store import Stamp, Store
from fedprompt.coordinator.usecases.board import Board, IdleClients
from fedprompt.coordinator.usecases.secagg import SecureRounds
from fedprompt.shared import drift, wire
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import FederationState, RoundState, SecureStage, TaskKind
from sqlalchemy import and_, bindparam, func, select
from sqlalchemy.orm import Session

# The poll's statements, built once (see store.py's _FED_ROW).
_OPEN_ROUND = select(Round.id, Round.number, Round.attempt, Round.base_version, Round.deadline_at).where(
    Round.federation_id == bindparam("fid"), Round.state == RoundState.OPEN
)
_EVALUATED = (
    select(Evaluation.id)
    .where(
        Evaluation.federation_id == bindparam("fid"),
        Evaluation.version == bindparam("version"),
        Evaluation.client_id == bindparam("client"),
    )
    .limit(1)
)
_PENDING = (  # selected for the round and not uploaded yet
    select(Participant.id)
    .outerjoin(
        Update, and_(Update.round_id == Participant.round_id, Update.client_id == Participant.client_id)
    )
    .where(
        Participant.round_id == bindparam("round"),
        Participant.client_id == bindparam("client"),
        Update.id.is_(None),
    )
)
# The same two checks for a batch of polls (next_tasks_at): which of these clients reported the
# version, which of them are still to upload.
_EVALUATED_AMONG = select(Evaluation.client_id).where(
    Evaluation.federation_id == bindparam("fid"),
    Evaluation.version == bindparam("version"),
    Evaluation.client_id.in_(bindparam("clients", expanding=True)),
)
_PENDING_AMONG = (
    select(Participant.client_id)
    .outerjoin(
        Update, and_(Update.round_id == Participant.round_id, Update.client_id == Participant.client_id)
    )
    .where(
        Participant.round_id == bindparam("round"),
        Participant.client_id.in_(bindparam("clients", expanding=True)),
        Update.id.is_(None),
    )
)
_IN_CHUNK = 500  # bound parameters per IN list (old SQLite builds allow 999 in a statement)
_PARTICIPANTS = select(Participant.client_id, Participant.id).where(
    Participant.round_id == bindparam("round")
)
_UPLOADED = select(Update.client_id).where(Update.round_id == bindparam("round"))
_TASKED = select(Participant.id).where(
    Participant.round_id == bindparam("round"), Participant.client_id == bindparam("client")
)


def _answer(ask: Any, *args: Any) -> dict[str, Any] | None | BaseException:
    """One poll's answer within a batch: its task, or the error that is its alone."""
    try:
        return ask(*args)
    except Exception as exc:
        return exc


class _Held(NamedTuple):
    """A train task handed out in mode async (the columns of Store.held_tasks)."""

    client_id: int
    number: int
    attempt: int
    base_version: int
    dispatched_at: float


_REPORTED = select(Evaluation.client_id).where(
    Evaluation.federation_id == bindparam("fid"), Evaluation.version == bindparam("version")
)
_ACTIVE_CLIENTS = (
    select(Client.id)
    .where(Client.federation_id == bindparam("fid"), Client.revoked_at.is_(None))
    .order_by(Client.id)
)


class Tasks:
    """A client's next task, and prompt downloads (a participant's counted for the ledger)."""

    def __init__(self, store: Store, secure: SecureRounds | None = None) -> None:
        self.store = store
        self.secure = secure or SecureRounds(store)
        self.idle = IdleClients()
        self._boards: dict[int, Board] = {}
        self._boards_lock = threading.Lock()
        store.add_change_listener(self._changed)

    def _changed(self, fid: int) -> None:
        """A change of the federation was announced: its idle marks and its board no longer hold."""
        self.idle.forget(fid)
        with self._boards_lock:
            self._boards.pop(fid, None)

    def get_prompt(self, fid: int, version: str | int, *, client: Client | None = None) -> PromptVersion:
        """A prompt version's blob ('latest' or a number); counts a participant's download."""
        with self.store.sessions() as s:
            _, pv = self.store.prompt_version(s, fid, version)
            record = self._participant_on_board(fid, pv.version, client)
            if record is None:
                record = self._download_to_record(s, fid, pv.version, client, len(pv.blob))
        self._record_download(record, len(pv.blob))
        return pv

    def cached_prompt(
        self, fid: int, version: str | int, *, client: Client | None = None
    ) -> PromptVersion | None:
        """`get_prompt` without I/O, or None when it needs the database: a numbered version held in
        memory (it can no longer change), fetched by the admin or by a client whom the federation's
        current board shows to be, or not to be, a participant fetching the open round's base version."""
        if isinstance(version, str) and not (version.isascii() and version.isdigit()):
            return None  # 'latest' and 'best' are resolved from the federation's row
        number = int(version)
        pv = self.store.cached_version(fid, number)
        if pv is None:
            return None
        record = None
        if client is not None:
            board = self._boards.get(fid)  # dropped at every announced change: current when held
            if board is None:
                return None
            if board.base_version == number:
                record = board.participants.get(client.id)
        if record is not None:
            if self.store.downloads.due_with(record):  # the write it makes due is done in a thread
                return None
            self.store.downloads.record(record, len(pv.blob), write=False)
        return pv

    def _participant_on_board(self, fid: int, version: int, client: Client | None) -> int | None:
        """The participant row a download of the open round's base version counts on, from the board
        (no query); None when there is no current board or the client is not its participant."""
        board = self._boards.get(fid)
        if client is None or board is None or board.base_version != version:
            return None
        return board.participants.get(client.id)

    def get_control(self, fid: int, version: str | int, *, client: Client | None = None) -> bytes:
        """SCAFFOLD's server control variate after a prompt version, as float32 safetensors (zeros
        after version 0); a participant's download of it counts beside the prompt's."""
        with self.store.sessions() as s:
            fed, pv = self.store.prompt_version(s, fid, version)
            spec = self.store.spec_of(fed)
            if not spec.scaffold:
                raise NotFound(f"federation {fid} does not use SCAFFOLD: it keeps no control variate")
            held = s.scalars(
                select(ServerOptimizerState.blob).where(
                    ServerOptimizerState.federation_id == fid, ServerOptimizerState.version == pv.version
                )
            ).first()
            latest = fed.latest_version
            prompt_bytes = len(pv.blob)
        if held is not None:
            control = drift.split(server_optim.decode_state(held))[1]
        elif pv.version == 0:
            control = drift.zeros(spec.tensor_shapes())
        else:
            raise Gone(
                f"the control variate after version {pv.version} is no longer kept; only the latest "
                f"version's ({latest}) is"
            )
        blob = wire.encode(
            {n: a.astype(np.float32) for n, a in control.items()}, {"version": str(pv.version)}
        )
        with self.store.sessions() as s:
            record = self._download_to_record(s, fid, pv.version, client, prompt_bytes + len(blob))
        self._record_download(record, prompt_bytes + len(blob))
        return blob

    @staticmethod
    def _download_to_record(
        s: Session, fid: int, version: int, client: Client | None, size: int
    ) -> int | None:
        """The participant row whose downloaded bytes should grow to `size`: a client selected for the
        open round fetching its base version (prompt, and with SCAFFOLD its control variate)."""
        if client is None:
            return None
        part = s.execute(
            select(Participant.id, Participant.downloaded_bytes)
            .join(Round, Round.id == Participant.round_id)
            .where(
                Round.federation_id == fid,
                Round.state == RoundState.OPEN,
                Round.base_version == version,
                Participant.client_id == client.id,
            )
        ).first()
        return None if part is None or part.downloaded_bytes >= size else part.id

    def _record_download(self, record: int | None, size: int) -> None:
        """Hand the figure to the download log (written behind: it acknowledges nothing)."""
        if record is not None:
            self.store.downloads.record(record, size)

    def next_task_at(self, fid: int, client: Client, stamp: Stamp) -> dict[str, Any] | None:
        """`next_task`, when the federation's change stamp is `stamp` (read before this call): a
        client that found nothing under the same stamp finds nothing again, without a query. A
        batch of one of `next_tasks_at`."""
        answer = self.next_tasks_at(fid, [(client, stamp)])[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _next_task_per_client(
        self, fid: int, client: Client, stamp: Stamp, spec: FederationSpec
    ) -> dict[str, Any] | None:
        """Mode async and secure rounds, whose tasks are per client: no board."""
        if self.idle.idle(fid, stamp, client.id):
            return None
        if spec.buffered:  # a task handed out, or an upload, frees or takes a slot: no mark holds
            return self.next_buffered_task(fid, client)
        generation = self.idle.generation(fid)
        found = self.next_task(fid, client)  # a secure round's stages are per client
        if found is None:
            self.idle.mark(fid, stamp, client.id, generation)
        return found

    def next_tasks_at(
        self, fid: int, polls: Sequence[tuple[Client, Stamp]]
    ) -> list[dict[str, Any] | None | BaseException]:
        """`next_task_at` for several clients' polls at once, in order: when a round opens or a
        version is made a thousand waiting polls wake together, and the board's tasks are confirmed
        with one query per kind for all of them instead of one query (and one thread) per poll. An
        error of one client's own answer (e.g. from `next_task`) is that poll's alone."""
        out: list[dict[str, Any] | None | BaseException] = [None] * len(polls)
        spec = self.store.cached_spec(fid)
        if spec.buffered or spec.secure_aggregation is not None:  # per client, as next_task_at
            for i, (client, stamp) in enumerate(polls):
                out[i] = _answer(self._next_task_per_client, fid, client, stamp, spec)
            return out
        generation = self.idle.generation(fid)
        by_stamp: dict[Stamp, list[int]] = {}
        for i, (client, stamp) in enumerate(polls):
            if not self.idle.idle(fid, stamp, client.id):
                by_stamp.setdefault(stamp, []).append(i)
        for stamp, indices in by_stamp.items():
            board = self._board(fid, stamp, generation)
            asked: list[int] = []
            trains: list[int] = []
            for i in indices:
                client = polls[i][0]
                if client.id not in board.ranks:  # enrolled (or revoked) since the board was read
                    out[i] = _answer(self.next_task, fid, client)
                    continue
                if (
                    board.evaluate is not None
                    and client.id not in board.evaluated
                    and asked_to_evaluate(client.info, board.evaluators, board.ranks[client.id])
                ):
                    asked.append(client.id)
                if (
                    board.train is not None
                    and client.id in board.participants
                    and client.id not in board.uploaded
                ):
                    trains.append(client.id)
                out[i] = board.done
            if asked or trains:
                reported, pending = self._confirm(fid, board, asked, trains)
                board.evaluated.update(set(asked) & reported)
                board.uploaded.update(set(trains) - pending)
                for i in indices:
                    cid = polls[i][0].id
                    if cid in board.ranks and cid in asked and cid not in reported:
                        out[i] = board.evaluate
                    elif cid in board.ranks and cid in pending:
                        out[i] = board.train
            for i in indices:
                if out[i] is None:
                    self.idle.mark(fid, stamp, polls[i][0].id, generation)
        return out

    def _confirm(
        self, fid: int, board: Board, asked: list[int], trains: list[int]
    ) -> tuple[set[int], set[int]]:
        """Of the clients the board asks to evaluate, those who reported its version meanwhile; of
        those it asks to train, those still to upload (each through this or another process)."""
        reported: set[int] = set()
        pending: set[int] = set()
        with self.store.sessions() as s:
            c = s.connection()
            for lo in range(0, len(asked), _IN_CHUNK):
                chunk = asked[lo : lo + _IN_CHUNK]
                params = {"fid": fid, "version": board.latest, "clients": chunk}
                reported.update(c.scalars(_EVALUATED_AMONG, params))
            for lo in range(0, len(trains), _IN_CHUNK):
                chunk = trains[lo : lo + _IN_CHUNK]
                pending.update(c.scalars(_PENDING_AMONG, {"round": board.round_id, "clients": chunk}))
        return reported, pending

    def learn_report(self, fid: int, version: int, client_id: int) -> None:
        """This process committed the client's report of `version`: the federation's board no longer
        offers it that evaluate task, without the query that would have found the report."""
        board = self._boards.get(fid)
        if board is not None and board.latest == version:
            board.evaluated.add(client_id)

    def learn_upload(self, fid: int, number: int, attempt: int, client_id: int) -> None:
        """This process committed the client's update for round `number` (attempt): the board no longer
        offers it that train task, without the query that would have found the update."""
        board = self._boards.get(fid)
        if board is not None and (board.round_number, board.attempt) == (number, attempt):
            board.uploaded.add(client_id)

    def _board(self, fid: int, stamp: Stamp, generation: int) -> Board:
        """The federation's board under this stamp, read now if the one held is older."""
        with self._boards_lock:
            board = self._boards.get(fid)
            if board is not None and board.stamp == stamp and board.generation == generation:
                return board
            board = self._read_board(fid, stamp, generation)
            if self.idle.generation(fid) == generation:  # else a change came meanwhile: use it once
                self._boards[fid] = board
            return board

    def _read_board(self, fid: int, stamp: Stamp, generation: int) -> Board:
        with self.store.sessions() as s:
            c = s.connection()
            fed = self.store.fed_row(s, fid)
            spec = self.store.spec(s, fid)
            rnd = c.execute(_OPEN_ROUND, {"fid": fid}).first()
            participants: dict[int, int] = {}
            uploaded: set[int] = set()
            train = None
            if rnd is not None:
                participants = dict(c.execute(_PARTICIPANTS, {"round": rnd.id}).tuples().all())
                uploaded = set(c.scalars(_UPLOADED, {"round": rnd.id}))
                train = self._train_task(s, fed, rnd, spec)
            latest = fed.latest_version
            evaluate = None
            evaluated: set[int] = set()
            if evaluation_due(latest, eval_every=spec.eval_every, rounds=spec.rounds):
                evaluated = set(c.scalars(_REPORTED, {"fid": fid, "version": latest}))
                evaluate = self._evaluate_task(s, fed)
            active = list(c.scalars(_ACTIVE_CLIENTS, {"fid": fid}))
        return Board(
            stamp=stamp,
            generation=generation,
            round_id=None if rnd is None else rnd.id,
            round_number=None if rnd is None else rnd.number,
            attempt=None if rnd is None else rnd.attempt,
            base_version=None if rnd is None else rnd.base_version,
            train=train,
            participants=participants,
            uploaded=uploaded,
            evaluate=evaluate,
            latest=latest,
            evaluated=evaluated,
            evaluators=spec.evaluators,
            ranks={cid: rank for rank, cid in enumerate(active)},
            done=self._done_task(fed),
        )

    def next_buffered_task(self, fid: int, client: Client) -> dict[str, Any] | None:
        """Mode async: evaluate the latest version when it is due (as in rounds); else the train task
        this client holds (handed out within round_deadline_s and not uploaded); else a new one from
        the latest version, if the client has not trained from it yet and fewer than `concurrency`
        clients hold one; else nothing. A new task is written under the federation lock, where the
        client's standing and the count are checked again, so replicas never hand out more."""
        with self.store.sessions() as s:
            c = s.connection()
            fed = self.store.fed_row(s, fid)
            spec = self.store.spec(s, fid)
            latest = fed.latest_version
            evaluate = self._evaluation_for(s, fed, spec, client)
            if evaluate is not None:
                return evaluate
            if fed.state == FederationState.COMPLETED:
                return self._done_task(fed)
            held = self.store.held_tasks(s, fid, spec, latest)
            own = [row for row in held if row.client_id == client.id]
            if own:
                return self._buffered_train_task(s, fed, own[-1], spec)
            rnd = c.execute(_OPEN_ROUND, {"fid": fid}).first()
            if rnd is None or not self._may_dispatch(c, rnd.id, client.id, len(held), spec):
                return None
        with self.store.tx() as s:
            fed_obj = self.store.lock_federation(s, fid)
            self.store.require_active(s, client.id)
            c = s.connection()
            rnd = c.execute(_OPEN_ROUND, {"fid": fid}).first()
            held = self.store.held_tasks(s, fid, spec, fed_obj.latest_version)
            own = [row for row in held if row.client_id == client.id]
            if own:  # a concurrent poll of this client took one meanwhile
                return self._buffered_train_task(s, self.store.fed_row(s, fid), own[-1], spec)
            if rnd is None or not self._may_dispatch(c, rnd.id, client.id, len(held), spec):
                return None
            now = self.store.clock()
            s.add(Participant(round_id=rnd.id, client_id=client.id, dispatched_at=now))
            row = _Held(client.id, rnd.number, rnd.attempt, rnd.base_version, now)
            return self._buffered_train_task(s, self.store.fed_row(s, fid), row, spec)

    @staticmethod
    def _may_dispatch(c: Any, round_id: int, client_id: int, held: int, spec: FederationSpec) -> bool:
        """Whether a client may be handed a task of the open buffer: it has not had one from this
        version (a second update from the same version would be counted twice in effect), and a
        concurrency slot is free."""
        if spec.concurrency is not None and held >= spec.concurrency:
            return False
        return c.scalar(_TASKED, {"round": round_id, "client": client_id}) is None

    def _buffered_train_task(self, s: Session, fed: Any, row: Any, spec: FederationSpec) -> dict[str, Any]:
        """A train task of mode async: the round it was handed out in, from that round's base version,
        due round_deadline_s after it was handed out."""
        return self._train_task(s, fed, row, spec, deadline_at=row.dispatched_at + spec.round_deadline_s)

    def next_task(self, fid: int, client: Client) -> dict[str, Any] | None:
        """What this client should do now: answer a secure round's keys, shares or unmasking stage
        (first: they take milliseconds and have short deadlines), evaluate the latest prompt (when that
        version is due an evaluation: the spec's eval_every), train for a round, or nothing."""
        with self.store.sessions() as s:
            c = s.connection()  # plain column reads on the Core connection: no ORM result processing
            fed = self.store.fed_row(s, fid)
            spec = self.store.spec(s, fid)
            rnd = c.execute(_OPEN_ROUND, {"fid": fid}).first()
            step = None  # a secure round's stage for this client: its stage decides, uploaded or not
            if spec.secure_aggregation is not None and rnd is not None:
                step = self.secure.task(s, fid, rnd, client.id, spec)
                if step is not None and step["stage"] != SecureStage.MASKED:  # the masked stage trains first
                    return step
            evaluate = self._evaluation_for(s, fed, spec, client)
            if evaluate is not None:
                return evaluate
            if rnd is not None:
                pending = c.scalar(_PENDING, {"round": rnd.id, "client": client.id})
                if spec.secure_aggregation is not None:
                    if step is not None:  # train, then upload a masked vector
                        return {
                            **self._train_task(s, fed, rnd, spec),
                            "secure_aggregation": {
                                k: v for k, v in step.items() if k not in ("kind", "round", "version")
                            },
                        }
                elif pending is not None:
                    return self._train_task(s, fed, rnd, spec)
        return self._done_task(fed)

    def _evaluation_for(
        self, s: Session, fed: Any, spec: FederationSpec, client: Client
    ) -> dict[str, Any] | None:
        """The evaluate task of the latest version, if it is due one, this client is asked to (the
        spec's evaluators) and has not reported it yet."""
        latest, c = fed.latest_version, s.connection()
        if not evaluation_due(latest, eval_every=spec.eval_every, rounds=spec.rounds):
            return None
        rank = self._rank(c, fed.id, client.id) if spec.evaluators else None
        if not asked_to_evaluate(client.info, spec.evaluators, rank):
            return None
        if c.scalar(_EVALUATED, {"fid": fed.id, "version": latest, "client": client.id}) is not None:
            return None
        return self._evaluate_task(s, fed)

    @staticmethod
    def _rank(c: Any, fid: int, client_id: int) -> int:
        """How many clients of the federation enrolled before this one and are not revoked."""
        return int(
            c.scalar(
                select(func.count(Client.id)).where(
                    Client.federation_id == fid, Client.id < client_id, Client.revoked_at.is_(None)
                )
            )
            or 0
        )

    def _evaluate_task(self, s: Session, fed: Any) -> dict[str, Any]:
        """Evaluate the latest prompt version."""
        latest = fed.latest_version
        return {
            "kind": TaskKind.EVALUATE,
            "round": latest,
            "version": latest,
            "sha256": self.store.version_sha(s, fed, latest),
        }

    @staticmethod
    def _done_task(fed: Any) -> dict[str, Any] | None:
        """The federation completed: the worker may stop (None while it runs)."""
        if fed.state != FederationState.COMPLETED:
            return None
        return {"kind": TaskKind.DONE, "round": fed.current_round, "version": fed.latest_version}

    def _train_task(
        self, s: Session, fed: Any, rnd: Any, spec: FederationSpec, deadline_at: float | None = None
    ) -> dict[str, Any]:
        """Train from the round's base version and upload (by the round's deadline unless another is given)."""
        return {
            "kind": TaskKind.TRAIN,
            "round": rnd.number,
            "attempt": rnd.attempt,
            "version": rnd.base_version,
            "sha256": self.store.version_sha(s, fed, rnd.base_version),
            "deadline_at": rnd.deadline_at if deadline_at is None else deadline_at,
            "config": {
                "local_steps": spec.local_steps,
                "local_epochs": spec.local_epochs,
                "batch_size": spec.batch_size,
                "lr": spec.lr,
                "grad_clip": spec.grad_clip,
                "local_optimizer": spec.local_optimizer,
                "seed": spec.seed,
                **(
                    {"drift_correction": spec.drift_correction.model_dump()}
                    if spec.drift_correction is not None
                    else {}
                ),
            },
        }
