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
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_never, wait_random_exponential

from shared import wire
from shared.client import ApiError, CoordinatorClient
from shared.evalstats import confusion_metrics
from shared.privacy import gaussian_ldp, gaussian_noise_multiplier, laplace_ldp, ldp_rng
from shared.secagg.protocol import flatten
from shared.spec import FederationSpec, client_steps
from worker.data import Example
from worker.poison import Backdoor
from worker.protocol import Engine, EngineFactory
from worker.secagg import SecureStages
from worker.slots import training_slot
from worker.state import Credentials, StateDir

log = logging.getLogger("fedprompt.worker")
T = TypeVar("T")


class Stopped(Exception):
    """The worker is shutting down."""


class FatalWorkerError(RuntimeError):
    """A problem retrying cannot fix (wrong model, refused enrolment); the message says what to do."""


def is_transient(exc: BaseException) -> bool:
    """Network errors, 5xx, 429 and 408 are worth retrying; other 4xx are answers."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, ApiError) and (exc.status >= 500 or exc.status in (408, 429))


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome else None
    retry_after = getattr(exc, "retry_after", None)
    backoff = wait_random_exponential(multiplier=0.5, max=20)(state)
    return max(float(retry_after), backoff) if retry_after else backoff


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
    eval_batch_size: int = 64
    backdoor: Backdoor | None = None
    # LDP noise seed (simulations, for reproducible runs); None: OS entropy, the production default
    ldp_seed: int | None = None


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
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            self.status.last_error = f"{what}: {exc}"
            log.warning("%s failed (%s); retrying", what, exc)
            if self._stop.is_set():
                raise Stopped()

        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            wait=_wait,
            stop=stop_never if forever else _stop_after(self._stop, 8),
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(fn)

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
        creds = self.state.load_credentials(cfg.federation_id)
        if creds is None:
            if not cfg.enrollment_token:
                raise FatalWorkerError(
                    f"no saved credentials in {self.state.credentials_path} and no enrolment token; "
                    "pass --enrollment-token"
                )
            self.status.state = "enrolling"
            anon = CoordinatorClient(cfg.coordinator, transport=self.transport)
            try:
                enrolled = self._retry(
                    "enrol",
                    lambda: anon.enroll(
                        cfg.federation_id,
                        cfg.enrollment_token or "",
                        name=cfg.name,
                        num_samples=len(self.train_data),
                        info={"num_eval": len(self.eval_data)},
                    ),
                )
            except ApiError as exc:
                raise FatalWorkerError(f"enrolment refused: {exc}") from None
            finally:
                anon.close()
            creds = Credentials(cfg.coordinator, cfg.federation_id, enrolled["client_id"], enrolled["token"])
            self.state.save_credentials(creds)
            log.info("enrolled as client %s", creds.client_id)
        self.status.client_id = creds.client_id
        self.client = CoordinatorClient(cfg.coordinator, creds.token, transport=self.transport)
        try:
            spec_json = self._retry("read spec", lambda: self.client.spec(cfg.federation_id))  # type: ignore[union-attr]
        except ApiError as exc:
            raise FatalWorkerError(f"cannot read the federation: {exc}") from None
        self.spec = FederationSpec.model_validate(spec_json)
        self.status.state = "loading"
        self.engine = self.engine_factory(self.spec, cfg.device)
        self.status.device = str(getattr(self.engine, "device", "cpu"))
        self._check_model()
        self._state_model_parameters()
        self.status.state = "idle"

    def _check_model(self) -> None:
        spec, engine = self.spec, self.engine
        assert spec is not None
        if spec.model_fingerprint and engine.fingerprint != spec.model_fingerprint:
            differs = model_differences(spec.model_info, getattr(engine, "description", None))
            raise FatalWorkerError(
                f"the local model's fingerprint {engine.fingerprint} differs from the federation's "
                f"{spec.model_fingerprint}"
                + (f" ({differs})" if differs else "")
                + f"; load exactly '{spec.model}'"
            )
        if engine.tensor_shapes() != spec.tensor_shapes():
            raise FatalWorkerError(
                f"the local model '{spec.model}' gives prompt shapes {engine.tensor_shapes()}, the federation "
                f"expects {spec.tensor_shapes()} (hidden_size={spec.hidden_size}); load the federation's model"
            )
        family = getattr(engine, "family", spec.family)
        if family != spec.family:
            raise FatalWorkerError(
                f"the local model is a {family} model, the federation reads label words as a {spec.family}; "
                f"load '{spec.model}'"
            )

    def _state_model_parameters(self) -> None:
        """Tell the coordinator the loaded model's parameter count when the spec does not state it: the
        ledger's full fine-tuning reference. Enrolment came before the model was known; the figure is
        only informational, so a failure is logged and the worker goes on."""
        spec, count = self.spec, getattr(self.engine, "model_parameters", None)
        if spec is None or spec.params_full_model is not None or not callable(count) or self.client is None:
            return
        try:
            stated = int(count())
            recorded = self.client.state_model_parameters(self.config.federation_id, stated)
        except (ApiError, httpx.HTTPError, ValueError, RuntimeError) as exc:
            log.warning("could not state the model's parameter count: %s", exc)
            return
        log.info("stated the model's %s parameters; the federation's figure is %s", stated, recorded)

    # -- tasks --------------------------------------------------------------------------------

    def _step(self) -> None:
        assert self.client is not None
        fid = self.config.federation_id
        try:
            task = self._retry("poll", lambda: self.client.task(fid, wait=self.config.poll_wait))  # type: ignore[union-attr]
        except ApiError as exc:
            if exc.status in (401, 403):
                raise FatalWorkerError(f"the coordinator refuses this worker: {exc}") from None
            raise
        if task is None:
            return
        kind = task["kind"]
        if kind == "evaluate":
            self._evaluate(task)
        elif kind == "train":
            self._train(task)
        elif kind == "secagg":
            self._secagg(task)
        elif kind == "done":
            self.status.state = "done"
            self._stop.wait(5.0)

    def _download(self, version: int, sha256: str) -> bytes:
        """The global prompt at `version`; the last one fetched is kept, so the version a worker
        evaluates is not fetched again when the next round trains from it."""
        assert self.client is not None
        if self._last_prompt is not None and self._last_prompt[:2] == (version, sha256):
            return self._last_prompt[2]
        prompt = self._retry("download", lambda: self.client.prompt(self.config.federation_id, version))  # type: ignore[union-attr]
        if wire.sha256(prompt.blob) != sha256 or prompt.sha256 != sha256:
            raise ApiError(502, {"detail": f"prompt version {version} failed its sha256 check"})
        self._last_prompt = (version, sha256, prompt.blob)
        return prompt.blob

    def _evaluate(self, task: dict[str, Any]) -> None:
        version = int(task["version"])
        self.status.state = "evaluating"
        blob = self._download(version, task["sha256"])
        with self.engine_lock:
            self.engine.load_prompt(blob)
            result = self.engine.evaluate(self.eval_data, batch_size=self.config.eval_batch_size)
            asr = (
                self.engine.evaluate(self.asr_data, batch_size=self.config.eval_batch_size)
                if self.asr_data
                else None
            )
        report: dict[str, Any] = {"num_samples": result.n, "accuracy": result.accuracy, "loss": result.loss}
        # per-class counts: the coordinator sums the clients' confusion matrices (per-class accuracy, macro-F1)
        metrics: dict[str, float] = dict(confusion_metrics(getattr(result, "confusion", None) or []))
        if asr is not None:
            # the coordinator weights ASR by its own sample count (non-target examples only)
            metrics |= {"asr": asr.accuracy, "asr_samples": asr.n}
        if metrics:
            report["metrics"] = metrics
        self.status.last_eval = {"version": version, **report}
        if self.metrics is not None:
            self.metrics.eval_accuracy.set(result.accuracy)
        self._retry(
            "report evaluation",
            lambda: self.client.report_evaluation(self.config.federation_id, version, report),  # type: ignore[union-attr]
        )
        self.status.versions_evaluated.append(version)
        self.status.state = "idle"

    def _train(self, task: dict[str, Any]) -> None:
        number, version, cfg = int(task["round"]), int(task["version"]), task["config"]
        self.status.state, self.status.round = "waiting-for-slot", number
        received_at, started = time.time(), time.perf_counter()
        blob_in = self._download(version, task["sha256"])
        download_s = time.perf_counter() - started
        with training_slot(self.config.slots_dir, self.config.slots, self._stop), self.engine_lock:
            slot_wait_s = time.perf_counter() - started - download_s
            self.status.state = "training"
            self.engine.load_prompt(blob_in)
            steps = client_steps(
                int(cfg["local_steps"]), cfg.get("local_epochs"), len(self.train_data), int(cfg["batch_size"])
            )
            self.status.step, self.status.total_steps = 0, steps
            last = [time.perf_counter()]

            def progress(step: int, total: int, loss: float) -> None:
                now = time.perf_counter()
                self.status.step = step
                if self.metrics is not None:
                    self.metrics.steps.inc()
                    self.metrics.step_seconds.observe(now - last[0])
                last[0] = now
                if self._stop.is_set():
                    raise Stopped()

            log.info("round %s: training %s steps on %s examples", number, steps, len(self.train_data))
            result = self.engine.train(
                self.train_data,
                steps=steps,
                batch_size=int(cfg["batch_size"]),
                lr=float(cfg["lr"]),
                grad_clip=float(cfg.get("grad_clip", 1.0)),
                seed=_round_seed(int(cfg.get("seed", 0)), number, self.status.client_id or 0),
                progress=progress,
            )
            metrics = {
                "loss": result.mean_loss,
                "last_loss": result.last_loss,
                "seconds": result.seconds,
                "steps": steps,
            }
            assert self.spec is not None
            tensors = self._release(blob_in, metrics)
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
                },
            }
            if "secure_aggregation" in task:  # the masked vector instead of the prompt
                trained = tensors if tensors is not None else self.engine.get_prompt()
                blob = self._masked(task, blob_in, trained, metrics)
            else:
                blob = self.engine.save_prompt(meta) if tensors is None else wire.encode(tensors, meta)
        log.info("round %s: trained in %.1f s, mean loss %.4f", number, result.seconds, result.mean_loss)
        self.state.save_pending(number, blob)
        self.status.last_train = {"round": number, **metrics}
        self._upload(number, blob)
        self.status.rounds_trained.append(number)
        self.status.state = "idle"

    def _secure(self) -> SecureStages:
        if self._secure_stages is None:
            self._secure_stages = SecureStages(self.config.state_dir, self.config.federation_id)
        return self._secure_stages

    def _secagg(self, task: dict[str, Any]) -> None:
        """A secure round's keys, shares or unmasking stage; the round secrets are kept in the state
        directory before anything derived from them is sent (worker/secagg.py)."""
        assert self.client is not None
        number, stage = int(task["round"]), str(task["stage"])
        self.status.state, self.status.round = f"secure-{stage}", number
        try:
            payload = self._secure().answer(task)
            self._retry(
                f"secure aggregation {stage}",
                lambda: self.client.secagg_stage(self.config.federation_id, number, stage, payload),  # type: ignore[union-attr]
            )
        except (ValueError, ApiError) as exc:  # ProtocolError, EnvelopeError, ShamirError: ValueErrors
            # the stage moved on, or it cannot be answered (too few neighbours): its deadline settles it
            log.warning("round %s: the %s stage was not answered: %s", number, stage, exc)
            self.status.last_error = f"secure aggregation {stage}, round {number}: {exc}"
            self._stop.wait(1.0)
        self.status.state = "idle"

    def _masked(
        self, task: dict[str, Any], blob_in: bytes, trained: dict[str, Any], metrics: dict[str, Any]
    ) -> bytes:
        """The masked upload of a secure round: the update (trained − global prompt, after LDP if any)
        clipped, quantised, weighted by this client's samples and masked."""
        assert self.spec is not None
        shapes = self.spec.tensor_shapes()
        update = flatten(trained, shapes) - flatten(wire.decode(blob_in)[0], shapes)
        numbers = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        return self._secure().masked(task, update, max(len(self.train_data), 1), numbers)

    def _release(self, blob_in: bytes, metrics: dict[str, Any]) -> dict[str, Any] | None:
        """The trained prompt as uploaded when it differs from the engine's: a malicious worker's ASR and
        attack, then local DP if the spec asks for it; None when the prompt goes up as trained."""
        backdoor, privacy = self.config.backdoor, self.spec.privacy if self.spec else None
        malicious = backdoor is not None and backdoor.malicious
        if not malicious and privacy is None:
            return None
        trained = self.engine.get_prompt()
        global_prompt = wire.decode(blob_in)[0]
        if backdoor is not None and malicious:
            # its own prompt before any attack: the backdoor (local ASR) and the clean task (local accuracy)
            if self.asr_data:
                local = self.engine.evaluate(self.asr_data, batch_size=self.config.eval_batch_size)
                metrics["local_asr"] = local.accuracy
            if self.eval_data:
                clean = self.engine.evaluate(self.eval_data, batch_size=self.config.eval_batch_size)
                metrics["local_accuracy"] = clean.accuracy
            trained = backdoor.manipulate(trained, global_prompt)
        if privacy is not None:
            # OS entropy unless seeded (simulations): noise from a seed someone else knows could be subtracted
            rng = ldp_rng(self.config.ldp_seed, self.status.round or 0)
            if privacy.mechanism == "gaussian":
                assert privacy.delta is not None  # the spec refuses gaussian without delta
                sigma = gaussian_noise_multiplier(privacy.epsilon, privacy.delta)
                trained = gaussian_ldp(
                    trained, global_prompt, bound=privacy.clip, noise_multiplier=sigma, rng=rng
                )
                metrics["noise_multiplier"] = sigma
            else:
                trained = laplace_ldp(
                    trained, global_prompt, bound=privacy.clip, epsilon=privacy.epsilon, rng=rng
                )
            metrics["epsilon"] = privacy.epsilon
        return trained

    def _upload(self, number: int, blob: bytes) -> None:
        """Send until acknowledged (2xx) or definitively refused; then forget the pending file."""
        assert self.client is not None
        self.status.state = "uploading"
        try:
            status, _ = self._retry(
                f"upload round {number}",
                lambda: self.client.upload(self.config.federation_id, number, blob),  # type: ignore[union-attr]
                forever=True,
            )
            log.info("round %s update acknowledged (%s)", number, status)
        except ApiError as exc:
            # 403/409/410/422: the round moved on or refused this update; keeping it cannot help.
            log.warning("round %s update refused, dropping it: %s", number, exc)
            self.status.last_error = f"upload round {number}: {exc}"
        self.state.clear_pending(number)

    def _resend_pending(self) -> None:
        for number, blob in self.state.pending():
            log.info("re-sending the unacknowledged update of round %s", number)
            self._upload(number, blob)


def _stop_after(stop_event: threading.Event, attempts: int) -> Callable[[RetryCallState], bool]:
    def stop(state: RetryCallState) -> bool:
        return stop_event.is_set() or state.attempt_number >= attempts

    return stop


def _round_seed(seed: int, number: int, client_id: int) -> int:
    """A per-(federation, round, client) training seed: reproducible, different across clients."""
    digest = hashlib.sha256(f"{seed}:{number}:{client_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def model_differences(expected: dict[str, Any] | None, local: dict[str, Any] | None) -> str:
    """What differs between the federation's model description and the local one (field: federation, local)."""
    if not expected or not local:
        return ""
    parts = []
    for key in sorted(set(expected) | set(local)):
        want, have = expected.get(key), local.get(key)
        if key == "files" and isinstance(want, dict) and isinstance(have, dict):
            changed = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            if changed:
                parts.append("files " + ", ".join(changed))
        elif want != have:
            parts.append(f"{key}: federation {want}, local {have}")
    return "; ".join(parts)


def load_engine(spec: FederationSpec, device: str) -> Engine:
    """The real engine for a federation spec."""
    from worker.engine import PromptEngine

    return PromptEngine.from_spec(spec, device=device)
