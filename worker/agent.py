"""The worker's agent loop: enrol, poll for tasks, evaluate and train the prompt, upload.

It pulls; the coordinator never calls a worker. Network faults are retried with exponential
backoff and jitter (tenacity), honouring Retry-After. A finished update is written to the state
directory before the first upload attempt and re-sent until the coordinator acknowledges it —
the coordinator answers an identical re-upload with 200, so re-sending is always safe.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import structlog
from fedprompt.shared import drift, wire
from fedprompt.shared.client import ApiError, CoordinatorClient
from fedprompt.shared.contract import DoneTask, EvaluateTask, SecaggTask, TrainTask
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.secagg.protocol import flatten
from fedprompt.shared.spec import FederationSpec, client_steps
from fedprompt.worker.data import Example
from fedprompt.worker.joining import FatalWorkerError, check_model, join, state_model_parameters
from fedprompt.worker.local_drift import train_options, update_scale
from fedprompt.worker.memory import release_freed_memory
from fedprompt.worker.poison import Backdoor
from fedprompt.worker.protocol import Engine, EngineFactory
from fedprompt.worker.release import evaluation_report, release
from fedprompt.worker.retry import Stopped, with_retries
from fedprompt.worker.secagg import SecureStages, evaluation_in_the_clear
from fedprompt.worker.slots import ElasticThreads, training_slot
from fedprompt.worker.state import StateDir
from pydantic import ValidationError

log = logging.getLogger("fedprompt.worker")
# the state of a client between tasks: it waits in a task long-poll
IDLE = "idle"
T = TypeVar("T")


@dataclass
class WorkerStatus:
    """What /status shows."""

    state: str = "starting"
    client_id: int | None = None
    federation_id: int | None = None
    round: int | None = None
    step: int = 0
    total_steps: int = 0
    rounds_trained: list[int] = field(default_factory=list)
    versions_evaluated: list[int] = field(default_factory=list)
    last_train: dict[str, Any] | None = None
    last_eval: dict[str, Any] | None = None
    last_error: str | None = None
    num_train: int = 0
    num_eval: int = 0
    device: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready copy."""
        return dict(self.__dict__, rounds_trained=list(self.rounds_trained))


@dataclass
class AgentConfig:
    """Everything the agent needs besides its data."""

    coordinator: str
    federation_id: int
    enrollment_token: str | None
    name: str
    state_dir: Path
    device: str = "auto"
    poll_wait: float = 20.0
    slots_dir: Path | None = None
    slots: int = 0
    num_threads: int | None = None
    # cores the slot holders of all pool processes share: a trainer takes budget // trainers threads
    thread_budget: int | None = None
    eval_batch_size: int = 64
    backdoor: Backdoor | None = None
    # LDP noise seed (simulations, for reproducible runs); None: OS entropy, the production default
    ldp_seed: int | None = None
    # f ≥ 1: a slow site (simulations): each trained update is held (f − 1) × its training time before
    # it is uploaded, so the coordinator sees f times the training time; 1: uploaded at once
    slowdown: float = 1.0


class Agent:
    """One worker's loop; `run()` blocks until `stop()` or a fatal error."""

    def __init__(
        self,
        config: AgentConfig,
        train: list[Example],
        evaluation: list[Example],
        *,
        metrics: Any = None,
        transport: httpx.BaseTransport | None = None,
        engine_factory: EngineFactory | None = None,
        engine_lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.config = config
        # Agents of one pool process share one engine: a task holds this from loading the global
        # prompt into the engine until the trained prompt is out of it.
        self.engine_lock: AbstractContextManager[Any] = engine_lock or threading.Lock()
        backdoor = config.backdoor
        # A malicious worker trains on its poisoned data; every worker with a target measures ASR.
        self.train_data = backdoor.poison_train(train) if backdoor else train
        self.eval_data = evaluation
        self.asr_data = backdoor.asr_examples(evaluation) if backdoor else []
        self.metrics = metrics
        self.transport = transport
        self.engine_factory = engine_factory or load_engine
        self.status = WorkerStatus(
            federation_id=config.federation_id, num_train=len(train), num_eval=len(evaluation)
        )
        self.state = StateDir(config.state_dir)
        self._stop = threading.Event()
        self.engine: Engine = None  # type: ignore[assignment]  # set in _setup, before any task
        self.spec: FederationSpec | None = None
        self.client: CoordinatorClient | None = None
        self._last_prompt: tuple[int, str, bytes] | None = None  # (version, sha256, blob)
        self._secure_stages: SecureStages | None = None

    # -- control ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish at the next opportunity (also interrupts training)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once stop() was called."""
        return self._stop.is_set()

    def _retry(self, what: str, fn: Callable[[], T], *, forever: bool = False) -> T:
        return with_retries(what, fn, stop=self._stop, on_error=self._note_error, forever=forever)

    def _note_error(self, error: str) -> None:
        self.status.last_error = error

    # -- lifecycle ----------------------------------------------------------------------------

    def run(self) -> None:
        """Enrol (or reuse credentials), load the model, then serve tasks until stopped."""
        # this thread's log lines name the client (a pool runs several in one process)
        structlog.contextvars.bind_contextvars(client_name=self.config.name)
        try:
            self._setup()
            self._resend_pending()
            while not self._stop.is_set():
                self._step()
        except Stopped:
            pass
        except FatalWorkerError as exc:
            self.status.state, self.status.last_error = "error", str(exc)
            log.error("%s", exc)
            raise
        finally:
            if self.status.state != "error":
                self.status.state = "stopped" if self._stop.is_set() else self.status.state
            if self.client is not None:
                self.client.close()

    def _setup(self) -> None:
        cfg = self.config
        creds = join(
            self.state,
            cfg.coordinator,
            cfg.federation_id,
            cfg.enrollment_token,
            name=cfg.name,
            num_samples=len(self.train_data),
            num_eval=len(self.eval_data),
            transport=self.transport,
            retry=self._retry,
            on_enrol=lambda: setattr(self.status, "state", "enrolling"),
        )
        self.status.client_id = creds.client_id
        client = self.client = CoordinatorClient(cfg.coordinator, creds.token, transport=self.transport)
        try:
            spec_json = self._retry("read spec", lambda: client.spec(cfg.federation_id))
        except ApiError as exc:
            raise FatalWorkerError(f"cannot read the federation: {exc}") from None
        self.spec = FederationSpec.model_validate(spec_json)
        self.status.state = "loading"
        # a model can take longer to load than three heartbeats: the site says it is alive meanwhile
        with self._beating(lambda: {"phase": "idle"}, name="heartbeat-loading"):
            self.engine = self.engine_factory(self.spec, cfg.device)
        self.status.device = str(getattr(self.engine, "device", "cpu"))
        check_model(self.spec, self.engine)
        state_model_parameters(self.client, self.spec, self.engine, cfg.federation_id)
        self.status.state = IDLE

    # -- tasks --------------------------------------------------------------------------------

    def _step(self) -> None:
        client = self.client
        assert client is not None
        fid = self.config.federation_id
        try:
            task = self._retry("poll", lambda: client.task(fid, wait=self.config.poll_wait))
        except ApiError as exc:
            if exc.status in (401, 403):
                raise FatalWorkerError(f"the coordinator refuses this worker: {exc}") from None
            raise
        except ValidationError as exc:
            # a kind this worker does not know (a newer coordinator's), or a malformed task
            # where and why only: pydantic's own text quotes the input, and a body never reaches a log
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            log.warning("a task this worker cannot read was left alone: %s", problems)
            self._stop.wait(1.0)
            return
        if isinstance(task, EvaluateTask):
            self._evaluate(task)
        elif isinstance(task, TrainTask):
            if task.secure_aggregation is None or self._secure_allows(task):
                self._train(task)
        elif isinstance(task, SecaggTask):
            self._secagg(task)
        elif isinstance(task, DoneTask):
            self.status.state = "done"
            self._stop.wait(5.0)

    def _download(self, version: int, sha256: str) -> bytes:
        """The global prompt at `version`; the last one fetched is kept, so the version a worker
        evaluates is not fetched again when the next round trains from it."""
        client = self.client
        assert client is not None
        if self._last_prompt is not None and self._last_prompt[:2] == (version, sha256):
            return self._last_prompt[2]
        prompt = self._retry("download", lambda: client.prompt(self.config.federation_id, version))
        if wire.sha256(prompt.blob) != sha256 or prompt.sha256 != sha256:
            raise ApiError(502, {"detail": f"prompt version {version} failed its sha256 check"})
        self._last_prompt = (version, sha256, prompt.blob)
        return prompt.blob

    def _evaluate(self, task: EvaluateTask) -> None:
        client = self.client
        assert client is not None
        version = task.version
        if not self.eval_data:  # it enrolled saying num_eval 0: the coordinator should not have asked
            raise FatalWorkerError(
                f"asked to evaluate version {version}, but this client holds no evaluation examples "
                "(it enrolled with num_eval 0); give it test data, or use a coordinator that honours num_eval"
            )
        self.status.state = "evaluating"
        blob = self._download(version, task.sha256)
        with self.engine_lock:
            self.engine.load_prompt(blob)
            result = self.engine.evaluate(self.eval_data, batch_size=self.config.eval_batch_size)
            asr = (
                self.engine.evaluate(self.asr_data, batch_size=self.config.eval_batch_size)
                if self.asr_data
                else None
            )
        release_freed_memory()
        report = evaluation_report(result, asr)
        if self.spec is not None and self.spec.secure_aggregation is not None:
            report = evaluation_in_the_clear(report, self.spec.secure_aggregation.report_confusion)
        self.status.last_eval = {"version": version, **report}
        if self.metrics is not None:
            self.metrics.eval_accuracy.set(result.accuracy)
        self._retry(
            "report evaluation",
            lambda: client.report_evaluation(self.config.federation_id, version, report),
        )
        self.status.versions_evaluated.append(version)
        self.status.state = IDLE

    def _train(self, task: TrainTask) -> None:
        with self._heartbeats(task.round):
            self._train_round(task)

    @contextmanager
    def _heartbeats(self, number: int) -> Iterator[None]:
        """Tell the coordinator every heartbeat_s that this client trains for round `number` (so a
        slow site is not taken for a dead one), and that it is idle once the round's work is done."""
        with self._beating(
            lambda: {
                "phase": "training",
                "round": number,
                "step": self.status.step,
                "total_steps": self.status.total_steps,
            },
            name=f"heartbeat-{number}",
        ):
            try:
                yield
            finally:
                self._activity({"phase": "idle", "round": number})

    @contextmanager
    def _beating(self, activity: Callable[[], dict[str, Any]], *, name: str) -> Iterator[None]:
        """Send `activity()` as a heartbeat now and every heartbeat_s while the block runs. Best
        effort: a heartbeat that fails is not retried, the next one goes on time."""
        assert self.spec is not None
        heartbeat_s = self.spec.heartbeat_s
        stop = threading.Event()

        def beat() -> None:
            while True:
                self._activity(activity())
                if stop.wait(heartbeat_s):
                    return

        thread = threading.Thread(target=beat, name=name, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5.0)

    def _activity(self, activity: dict[str, Any]) -> None:
        assert self.client is not None
        try:
            self.client.activity(self.config.federation_id, activity)
        except (ApiError, httpx.HTTPError) as exc:
            log.debug("heartbeat not delivered: %s", exc)

    def _train_round(self, task: TrainTask) -> None:
        # the spec's training settings as the task repeats them (the worker's own copy of the spec has them too)
        number, version, cfg = task.round, task.version, task.config
        self.status.state, self.status.round = "waiting-for-slot", number
        received_at, started = time.time(), time.perf_counter()
        blob_in = self._download(version, task.sha256)
        assert self.spec is not None
        # SCAFFOLD: the server's control variate of the same version, fetched before a slot is taken
        server_control = self._server_control(version) if self.spec.scaffold else None
        download_s = time.perf_counter() - started
        with (
            self.engine_lock,  # before the slot: a slot is held only by a client that trains
            training_slot(self.config.slots_dir, self.config.slots, self._stop),
            self._elastic_threads() as threads,
        ):
            slot_wait_s = time.perf_counter() - started - download_s
            self.status.state = "training"
            self.engine.load_prompt(blob_in)
            steps = client_steps(cfg.local_steps, cfg.local_epochs, len(self.train_data), cfg.batch_size)
            self.status.step, self.status.total_steps = 0, steps
            last = [time.perf_counter()]

            def progress(step: int, total: int, loss: float) -> None:
                now = time.perf_counter()
                self.status.step = step
                if self.metrics is not None:
                    self.metrics.steps.inc()
                    self.metrics.step_seconds.observe(now - last[0])
                last[0] = now
                threads.adjust()
                if self._stop.is_set():
                    raise Stopped()

            log.info("round %s: training %s steps on %s examples", number, steps, len(self.train_data))
            own_control = self._own_control() if server_control is not None else None
            options = train_options(self.spec.drift_correction, server_control, own_control)
            result = self.engine.train(
                self.train_data,
                steps=steps,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                grad_clip=cfg.grad_clip,
                optimizer=cfg.local_optimizer,
                seed=round_seed(cfg.seed, number, self.status.client_id or 0),
                progress=progress,
                **options,
            )
            metrics = {
                "loss": result.mean_loss,
                "last_loss": result.last_loss,
                "seconds": result.seconds,
                "steps": steps,
            }
            slowdown_wait_s = (self.config.slowdown - 1.0) * result.seconds
            tensors = self._release(blob_in, metrics)
            if own_control is not None:  # SCAFFOLD: Δc_i travels with the prompt, c_i⁺ waits for the ack
                assert result.mean_gradient is not None
                new_control, delta = drift.client_control(result.mean_gradient, own_control)
                prompt = tensors if tensors is not None else self.engine.get_prompt()
                tensors = {**prompt, **drift.prefixed(_float32(delta))}
                self.state.save_pending_control(number, wire.encode(_float32(new_control)))
            meta = {
                "method": self.spec.method,
                "model_fingerprint": self.engine.fingerprint,
                "base_version": str(version),
                "round": str(number),
                "num_samples": str(len(self.train_data)),
                "metrics": metrics,
                # where the round's time went on this side (bench/e2e.py splits rounds with it)
                "timing": {
                    "task_received_at": received_at,
                    "download_s": download_s,
                    "slot_wait_s": slot_wait_s,
                    "trained_at": time.time(),
                    "slowdown_wait_s": slowdown_wait_s,  # held after trained_at, before the upload
                },
            }
            if task.secure_aggregation is not None:  # the masked vector instead of the prompt
                trained = tensors if tensors is not None else self.engine.get_prompt()
                blob = self._masked(task, blob_in, trained, metrics)
            else:
                blob = self.engine.save_prompt(meta) if tensors is None else wire.encode(tensors, meta)
        release_freed_memory()  # what the round's training freed: another client of this process trains next
        log.info("round %s: trained in %.1f s, mean loss %.4f", number, result.seconds, result.mean_loss)
        self.state.save_pending(number, blob)
        self.status.last_train = {"round": number, **metrics, "slowdown_wait_s": slowdown_wait_s}
        if slowdown_wait_s > 0:
            self._slow_down(number, slowdown_wait_s)
        self._upload(number, blob)
        self.status.rounds_trained.append(number)
        self.status.state = IDLE

    def _slow_down(self, number: int, wait_s: float) -> None:
        """Hold a trained update `wait_s` seconds of real time (AgentConfig.slowdown), after the engine
        and the training slot are given back: a pool's other clients train meanwhile, as a slow site
        would not hold them up. The heartbeats go on saying it trains. A stop ends the wait; the update
        stays pending, and a restart sends it."""
        self.status.state = "slowed-down"
        log.info("round %s: slowdown %g, uploading in %.1f s", number, self.config.slowdown, wait_s)
        if self._stop.wait(wait_s):
            raise Stopped()

    def _elastic_threads(self) -> ElasticThreads:
        cfg = self.config
        # the floor is the thread count the process runs with outside training (the engine's default
        # when the pool file names none), so leaving the block restores what was there
        floor = cfg.num_threads or _get_threads()
        return ElasticThreads(cfg.slots_dir, cfg.slots, cfg.thread_budget, floor, _set_threads)

    def _secure(self) -> SecureStages:
        if self._secure_stages is None:
            assert self.spec is not None and self.status.client_id is not None
            self._secure_stages = SecureStages(
                self.config.state_dir,
                self.config.federation_id,
                self.status.client_id,
                Policy.from_spec(self.spec),  # t, k and the minimum from this worker's own copy of the spec
            )
        return self._secure_stages

    def _secagg(self, task: SecaggTask) -> None:
        """A secure round's keys, shares or unmasking stage; the round secrets are kept in the state
        directory before anything derived from them is sent (worker/secagg.py)."""
        client = self.client
        assert client is not None
        number, stage = task.round, str(task.stage)
        self.status.state, self.status.round = f"secure-{stage}", number
        try:
            # the stage's members by name, its own ones (index, roster, envelopes, ...) included: as sent
            payload = self._secure().answer(task.model_dump(exclude_unset=True))
            self._retry(
                f"secure aggregation {stage}",
                lambda: client.secagg_stage(self.config.federation_id, number, stage, payload),
            )
        except (ValueError, ApiError) as exc:  # ProtocolError, EnvelopeError, ShamirError: ValueErrors
            # the stage moved on, or it cannot be answered (too few neighbours): its deadline settles it
            log.warning("round %s: the %s stage was not answered: %s", number, stage, exc)
            self.status.last_error = f"secure aggregation {stage}, round {number}: {exc}"
            self._stop.wait(1.0)
        self.status.state = IDLE

    def _secure_allows(self, task: TrainTask) -> bool:
        """Whether this client makes a masked vector for a secure round's train task (worker/secagg.py);
        a task it refuses is not trained for, and its deadline settles it."""
        try:
            self._secure().check_masked(task.model_dump(exclude_unset=True))
        except ValueError as exc:  # ProtocolError, EnvelopeError
            log.warning("round %s: the masked stage was not answered: %s", task.round, exc)
            self.status.last_error = f"secure aggregation masked, round {task.round}: {exc}"
            self._stop.wait(1.0)
            return False
        return True

    def _masked(
        self, task: TrainTask, blob_in: bytes, trained: dict[str, Any], metrics: dict[str, Any]
    ) -> bytes:
        """The masked upload of a secure round: the update (trained − global prompt, after LDP if any)
        clipped, quantised, weighted by this client's samples and masked."""
        assert self.spec is not None
        shapes = self.spec.tensor_shapes()
        update = flatten(trained, shapes) - flatten(wire.decode(blob_in)[0], shapes)
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        return self._secure().masked(
            task.model_dump(exclude_unset=True), update, max(len(self.train_data), 1), numbers
        )

    def _release(self, blob_in: bytes, metrics: dict[str, Any]) -> dict[str, Any] | None:
        """The trained prompt as uploaded when it differs from the engine's (worker/release.py); None
        when the prompt goes up as trained."""
        backdoor, privacy = self.config.backdoor, self.spec.privacy if self.spec else None
        malicious = backdoor is not None and backdoor.malicious
        scale = update_scale(self.spec, self.train_data)
        if scale is not None and not malicious:
            log.info("round %s: update scaled by %.3f, its labels' entropy", self.status.round, scale)
        if not malicious and privacy is None and scale is None:
            return None
        return release(
            self.engine.get_prompt(),
            wire.decode(blob_in)[0],
            metrics,
            backdoor=backdoor,
            privacy=privacy,
            evaluate=lambda examples: self.engine.evaluate(examples, batch_size=self.config.eval_batch_size),
            asr_data=self.asr_data,
            eval_data=self.eval_data,
            ldp_seed=self.config.ldp_seed,
            round_number=self.status.round or 0,
            update_scale=scale,
        )

    def _upload(self, number: int, blob: bytes) -> None:
        """Send until acknowledged (2xx) or definitively refused; then forget the pending file."""
        client = self.client
        assert client is not None
        self.status.state = "uploading"
        try:
            status, _ = self._retry(
                f"upload round {number}",
                lambda: client.upload(self.config.federation_id, number, blob),
                forever=True,
            )
            log.info("round %s update acknowledged (%s)", number, status)
            self.state.settle_control(number, acknowledged=True)
        except ApiError as exc:
            # 403/409/410/422: the round moved on or refused this update; keeping it cannot help.
            log.warning("round %s update refused, dropping it: %s", number, exc)
            self.status.last_error = f"upload round {number}: {exc}"
            self.state.settle_control(number, acknowledged=False)
        self.state.clear_pending(number)

    def _own_control(self) -> dict[str, np.ndarray]:
        """This client's SCAFFOLD control variate c_i (zeros before its first acknowledged update)."""
        assert self.spec is not None
        held = self.state.load_control()
        if held is None:
            return drift.zeros(self.spec.tensor_shapes())
        tensors, _ = wire.decode_checked(held, self.spec.tensor_shapes())
        return {n: a.astype(np.float64) for n, a in tensors.items()}

    def _server_control(self, version: int) -> dict[str, np.ndarray]:
        """The server's control variate after the round's base version, checked against the spec."""
        client = self.client
        assert client is not None and self.spec is not None
        blob = self._retry(
            "download control variate", lambda: client.control(self.config.federation_id, version)
        )
        try:
            tensors, _ = wire.decode_checked(blob, self.spec.tensor_shapes())
        except wire.WireError as exc:
            raise ApiError(
                502, {"detail": f"the control variate of version {version} is malformed: {exc}"}
            ) from None
        return {n: a.astype(np.float64) for n, a in tensors.items()}

    def _resend_pending(self) -> None:
        for number, blob in self.state.pending():
            log.info("re-sending the unacknowledged update of round %s", number)
            self._upload(number, blob)


def round_seed(seed: int, number: int, client_id: int) -> int:
    """A per-(federation, round, client) training seed: reproducible, different across clients."""
    digest = hashlib.sha256(f"{seed}:{number}:{client_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def load_engine(spec: FederationSpec, device: str) -> Engine:
    """The real engine for a federation spec."""
    from fedprompt.worker.engine import PromptEngine

    return PromptEngine.from_spec(spec, device=device)


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _get_threads() -> int:
    import torch

    return torch.get_num_threads()


def _float32(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: np.asarray(a, np.float32) for n, a in arrays.items()}
