"""The agent loop against a mocked coordinator (httpx MockTransport) and a fake engine: retries,
Retry-After, durable pending updates, credentials reuse."""

from __future__ import annotations

import json
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import DriftCorrectionSpec
from fedprompt.worker.agent import Agent, AgentConfig
from fedprompt.worker.data import Example
from fedprompt.worker.slots import held_slots

SPEC = FederationSpec(num_virtual_tokens=2, hidden_size=4, min_clients=1, local_steps=3)


@dataclass
class _Train:
    mean_loss: float = 0.5
    last_loss: float = 0.4
    seconds: float = 0.01


@dataclass
class _Eval:
    accuracy: float = 0.75
    loss: float = 0.5
    n: int = 4


class FakeEngine:
    """Just enough of PromptEngine for the agent."""

    fingerprint = "fake"
    device = "cpu"

    def __init__(self) -> None:
        self.prompt = np.zeros((2, 4), np.float32)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        return SPEC.tensor_shapes()

    def load_prompt(self, blob: bytes) -> dict[str, str]:
        tensors, meta = wire.decode(blob)
        self.prompt = tensors["prompt_embeddings"]
        return meta

    def train(self, examples: list[Example], *, steps: int, progress: Any, **_: Any) -> _Train:
        for step in range(1, steps + 1):
            self.prompt = self.prompt + 1.0
            progress(step, steps, 0.5)
        return _Train()

    def evaluate(self, examples: list[Example], batch_size: int = 64) -> _Eval:
        return _Eval(n=len(examples))

    def save_prompt(self, metadata: dict[str, Any]) -> bytes:
        return wire.encode({"prompt_embeddings": self.prompt}, metadata)


class FakeCoordinator:
    """A scripted coordinator: one train task, then done; the first uploads fail with 503."""

    def __init__(self, fail_uploads: int, config: dict[str, Any] | None = None) -> None:
        self.fail_uploads = fail_uploads
        self.config = config or {"local_steps": 3, "batch_size": 2, "lr": 0.1, "seed": 0}
        self.calls: list[str] = []
        self.uploads: list[bytes] = []
        self.trained = False
        self.initial = wire.encode({"prompt_embeddings": np.ones((2, 4), np.float32)}, {"version": "0"})
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        with self.lock:
            self.calls.append(f"{method} {path}")
        if method == "POST" and path.endswith("/clients"):
            enrolled = {
                "client_id": 7,
                "token": "fpc_x",
                "federation_id": 1,
                "spec": SPEC.model_dump(mode="json"),
            }
            return httpx.Response(201, json=enrolled)
        if path.endswith("/spec"):
            return httpx.Response(200, json=SPEC.model_dump(mode="json"))
        if path.endswith("/task"):
            if not self.trained:
                self.trained = True
                return httpx.Response(
                    200,
                    json={
                        "kind": "train",
                        "round": 1,
                        "attempt": 1,
                        "version": 0,
                        "sha256": wire.sha256(self.initial),
                        "deadline_at": 2e9,
                        "config": self.config,
                    },
                )
            return httpx.Response(200, json={"kind": "done", "round": 1, "version": 1})
        if "/prompts/" in path:
            sha = wire.sha256(self.initial)
            return httpx.Response(
                200, content=self.initial, headers={"X-Prompt-Version": "0", "X-Prompt-Sha256": sha}
            )
        if path.endswith("/update"):
            self.uploads.append(request.content)
            if len(self.uploads) <= self.fail_uploads:
                return httpx.Response(503, json={"detail": "try later"}, headers={"Retry-After": "0"})
            receipt = {
                "round": 1,
                "attempt": 1,
                "client_id": 7,
                "sha256": wire.sha256(request.content),
                "num_samples": 4,
                "size": len(request.content),
            }
            return httpx.Response(201, json=receipt)
        return httpx.Response(404, json={"detail": f"unexpected {method} {path}"})


def _agent(
    tmp_path: Path,
    coordinator: FakeCoordinator,
    token: str | None = "fpe_x",
    engine: type[FakeEngine] | None = None,
    examples: list[Example] | None = None,
    **settings: Any,
) -> Agent:
    examples = examples or [Example(text=f"t{i}", label=i % 2) for i in range(4)]
    config = AgentConfig(
        coordinator="http://coordinator",
        federation_id=1,
        enrollment_token=token,
        name="w",
        state_dir=tmp_path,
        **settings,
    )
    return Agent(
        config,
        examples,
        examples,
        transport=httpx.MockTransport(coordinator),
        engine_factory=lambda s, d: (engine or FakeEngine)(),
    )


def _run_until_done(agent: Agent) -> None:
    thread = threading.Thread(target=agent.run)
    thread.start()
    for _ in range(300):
        if agent.status.state == "done":
            break
        thread.join(0.05)
    agent.stop()
    thread.join(10)
    assert not thread.is_alive()


def test_local_epochs_cap_the_steps_and_the_update_states_them(tmp_path: Path) -> None:
    config = {"local_steps": 3, "local_epochs": 1.0, "batch_size": 2, "lr": 0.1, "seed": 0}
    coordinator = FakeCoordinator(fail_uploads=0, config=config)
    agent = _agent(tmp_path, coordinator)
    _run_until_done(agent)
    tensors, meta = wire.decode(coordinator.uploads[-1])
    # one pass over 4 examples in batches of 2: 2 steps (not 3), each adding 1 to the prompt of ones
    np.testing.assert_array_equal(tensors["prompt_embeddings"], np.full((2, 4), 3.0, np.float32))
    assert json.loads(meta["metrics"])["steps"] == 2
    assert json.loads(meta["timing"])["slowdown_wait_s"] == 0.0  # slowdown 1 (the default): no wait


def test_upload_is_retried_until_acknowledged_and_pending_file_cleared(tmp_path: Path) -> None:
    coordinator = FakeCoordinator(fail_uploads=2)
    agent = _agent(tmp_path, coordinator)
    _run_until_done(agent)
    assert len(coordinator.uploads) == 3 and len(set(coordinator.uploads)) == 1  # the same bytes each time
    tensors, meta = wire.decode(coordinator.uploads[0])
    np.testing.assert_array_equal(tensors["prompt_embeddings"], np.full((2, 4), 4.0, np.float32))
    assert (
        meta["base_version"] == "0"
        and meta["num_samples"] == "4"
        and json.loads(meta["metrics"])["loss"] == 0.5
    )
    assert agent.status.rounds_trained == [1]
    assert list((tmp_path / "pending").iterdir()) == []
    creds = tmp_path / "credentials.json"
    assert json.loads(creds.read_text())["client_id"] == 7
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600


def test_restart_resends_pending_update_before_polling_and_reuses_credentials(tmp_path: Path) -> None:
    first = FakeCoordinator(fail_uploads=0)
    _run_until_done(_agent(tmp_path, first))
    leftover = wire.encode({"prompt_embeddings": np.full((2, 4), 9.0, np.float32)}, {"num_samples": "4"})
    (tmp_path / "pending" / "1.safetensors").write_bytes(leftover)  # as if killed before the ack arrived
    second = FakeCoordinator(fail_uploads=0)
    second.trained = True
    _run_until_done(_agent(tmp_path, second, token=None))
    assert second.uploads[0] == leftover
    assert not any(c.startswith("POST") and c.endswith("/clients") for c in second.calls)  # no re-enrolment
    first_poll = next(i for i, c in enumerate(second.calls) if c.endswith("/task"))
    first_upload = next(i for i, c in enumerate(second.calls) if c.endswith("/update"))
    assert first_upload < first_poll
    assert list((tmp_path / "pending").iterdir()) == []


class EvaluateThenTrain(FakeCoordinator):
    """Asks for an evaluation of version 0, then a round that trains from the same version."""

    def __init__(self) -> None:
        super().__init__(fail_uploads=0)
        self.evaluated = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/task") and not self.evaluated:
            self.evaluated = True
            return httpx.Response(
                200, json={"kind": "evaluate", "round": 0, "version": 0, "sha256": wire.sha256(self.initial)}
            )
        if request.url.path.endswith("/evaluation"):
            return httpx.Response(201, json={"version": 0, "stored": True})
        return super().__call__(request)


def test_a_version_evaluated_is_not_downloaded_again_to_train(tmp_path: Path) -> None:
    coordinator = EvaluateThenTrain()
    agent = _agent(tmp_path, coordinator)
    _run_until_done(agent)
    assert agent.status.versions_evaluated == [0] and agent.status.rounds_trained == [1]
    assert sum("/prompts/" in c for c in coordinator.calls) == 1


class NewerKindFirst(FakeCoordinator):
    """First asks for a kind of task this worker does not know (a newer coordinator's), then as usual."""

    def __init__(self) -> None:
        super().__init__(fail_uploads=0)
        self.asked = False

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/task") and not self.asked:
            self.asked = True
            return httpx.Response(200, json={"kind": "distill", "round": 1, "version": 0})
        return super().__call__(request)


def test_a_task_of_an_unknown_kind_is_left_alone(tmp_path: Path) -> None:
    coordinator = NewerKindFirst()
    agent = _agent(tmp_path, coordinator)
    _run_until_done(agent)
    assert coordinator.asked and agent.status.rounds_trained == [1] and len(coordinator.uploads) == 1


class SizedEngine(FakeEngine):
    """A fake engine that knows its model's size, as PromptEngine does."""

    def model_parameters(self) -> int:
        return 22_713_216


class TakesModelSize(FakeCoordinator):
    """Serves `spec` and keeps the model sizes stated to it (the first is the federation's figure)."""

    def __init__(self, spec: FederationSpec) -> None:
        super().__init__(fail_uploads=0)
        self.spec = spec
        self.stated: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/model-parameters") and request.method == "PUT":
            self.stated.append(json.loads(request.content)["model_parameters"])
            return httpx.Response(200, json={"model_parameters": self.stated[0]})
        if request.url.path.endswith("/spec"):
            return httpx.Response(200, json=self.spec.model_dump(mode="json"))
        return super().__call__(request)


def test_the_loaded_models_size_is_stated_only_when_the_spec_does_not_state_it(tmp_path: Path) -> None:
    unsized = TakesModelSize(SPEC)
    _run_until_done(_agent(tmp_path / "unsized", unsized, engine=SizedEngine))
    assert unsized.stated == [22_713_216] and len(unsized.uploads) == 1
    sized = TakesModelSize(SPEC.model_copy(update={"params_full_model": 10_000}))
    _run_until_done(_agent(tmp_path / "sized", sized, engine=SizedEngine))
    assert sized.stated == [] and len(sized.uploads) == 1


def test_a_coordinator_that_refuses_the_model_size_does_not_stop_the_worker(tmp_path: Path) -> None:
    older = FakeCoordinator(fail_uploads=0)  # answers 404 to the statement, as one without the route
    agent = _agent(tmp_path, older, engine=SizedEngine)
    _run_until_done(agent)
    assert any(c == "PUT /api/v1/federations/1/model-parameters" for c in older.calls)
    assert len(older.uploads) == 1 and agent.status.rounds_trained == [1]


# -- a slow site (AgentConfig.slowdown) ----------------------------------------------------------


class SlowEngine(FakeEngine):
    """Trains for a quarter of a second of real time and reports it, as PromptEngine measures it."""

    def __init__(self) -> None:
        super().__init__()
        self.finished_at = 0.0

    def train(self, examples: list[Example], *, steps: int, progress: Any, **_: Any) -> _Train:
        started = time.monotonic()
        time.sleep(0.25)
        super().train(examples, steps=steps, progress=progress)
        self.finished_at = time.monotonic()
        return _Train(seconds=self.finished_at - started)


class TimesUploads(FakeCoordinator):
    """Notes when each upload arrives."""

    def __init__(self) -> None:
        super().__init__(fail_uploads=0)
        self.uploaded_at: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/update"):
            self.uploaded_at.append(time.monotonic())
        return super().__call__(request)


def _when_slowed_down(agent: Agent, then: Callable[[], None]) -> threading.Thread:
    """A thread that runs `then` once the agent holds a trained update back (or gives up after 10 s)."""

    def watch() -> None:
        deadline = time.monotonic() + 10
        while agent.status.state != "slowed-down" and time.monotonic() < deadline:
            time.sleep(0.005)
        then()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_a_slow_client_uploads_after_f_minus_1_times_its_training_with_engine_and_slot_free(
    tmp_path: Path,
) -> None:
    coordinator, slots = TimesUploads(), tmp_path / "slots"
    agent = _agent(tmp_path, coordinator, engine=SlowEngine, slowdown=3.0, slots_dir=slots, slots=1)
    seen: list[tuple[str, bool, int]] = []

    def look() -> None:  # during the wait: may another client of the pool train?
        free = agent.engine_lock.acquire(blocking=False)
        if free:
            agent.engine_lock.release()
        seen.append((agent.status.state, free, held_slots(slots, 1)))

    watcher = _when_slowed_down(agent, look)
    _run_until_done(agent)
    watcher.join()

    assert seen == [("slowed-down", True, 0)]
    (uploaded_at,) = coordinator.uploaded_at
    _, meta = wire.decode(coordinator.uploads[0])
    trained_s, timing = json.loads(meta["metrics"])["seconds"], json.loads(meta["timing"])
    assert trained_s >= 0.25 and timing["slowdown_wait_s"] == pytest.approx(2 * trained_s)
    assert isinstance(agent.engine, SlowEngine)
    held = uploaded_at - agent.engine.finished_at  # real time, from the end of training to the upload
    assert 2 * trained_s - 0.01 <= held < 2 * trained_s + 2.0
    assert agent.status.last_train is not None
    assert agent.status.last_train["slowdown_wait_s"] == timing["slowdown_wait_s"]


def test_stopping_ends_a_slow_clients_wait_and_keeps_its_update_pending(tmp_path: Path) -> None:
    coordinator = TimesUploads()
    agent = _agent(tmp_path, coordinator, engine=SlowEngine, slowdown=1_000.0)  # about 4 minutes
    thread = threading.Thread(target=agent.run)
    thread.start()
    watcher = _when_slowed_down(agent, agent.stop)
    watcher.join()
    thread.join(5)

    assert not thread.is_alive() and agent.status.state == "stopped"
    assert coordinator.uploads == [] and len(list((tmp_path / "pending").iterdir())) == 1


# -- SCAFFOLD on the client's side ------------------------------------------------------------

SCAFFOLD_SPEC = SPEC.model_copy(update={"drift_correction": DriftCorrectionSpec(name="scaffold")})
SERVER_C = np.full((2, 4), 0.25, np.float32)
MEAN_GRAD = np.arange(8, dtype=np.float64).reshape(2, 4) / 10


class ScaffoldEngine(FakeEngine):
    seen: list[dict[str, Any]] = []

    def get_prompt(self) -> dict[str, np.ndarray]:
        return {"prompt_embeddings": self.prompt}

    def train(self, examples: list[Example], *, steps: int, progress: Any, **options: Any) -> _Train:
        ScaffoldEngine.seen.append(options)
        result = super().train(examples, steps=steps, progress=progress)
        result.mean_gradient = {"prompt_embeddings": MEAN_GRAD}  # type: ignore[attr-defined]
        return result


class ScaffoldCoordinator(FakeCoordinator):
    def __init__(self, answer: int) -> None:
        super().__init__(0)
        self.answer = answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/spec"):
            return httpx.Response(200, json=SCAFFOLD_SPEC.model_dump(mode="json"))
        if path.endswith("/prompts/0/control"):
            return httpx.Response(200, content=wire.encode({"prompt_embeddings": SERVER_C}))
        if path.endswith("/update") and self.answer != 201:
            self.uploads.append(request.content)
            return httpx.Response(self.answer, json={"detail": "refused"})
        return super().__call__(request)


@pytest.mark.parametrize("answer", [201, 409])
def test_a_scaffold_client_corrects_uploads_its_change_and_keeps_c_i_only_once_acknowledged(
    tmp_path: Path, answer: int
) -> None:
    ScaffoldEngine.seen = []
    coordinator = ScaffoldCoordinator(answer)
    _run_until_done(_agent(tmp_path, coordinator, engine=ScaffoldEngine))
    (options,) = ScaffoldEngine.seen
    assert options["mean_gradient"] is True and "prox_mu" not in options
    np.testing.assert_allclose(options["correction"]["prompt_embeddings"], 0.25)  # c − c_i, c_i = 0 at first
    tensors, _ = wire.decode(coordinator.uploads[-1])
    np.testing.assert_allclose(tensors["control/prompt_embeddings"], MEAN_GRAD, rtol=1e-6)  # Δc_i = c_i⁺ − 0
    held = tmp_path / "control.safetensors"
    if answer == 201:
        np.testing.assert_allclose(
            wire.decode(held.read_bytes())[0]["prompt_embeddings"], MEAN_GRAD, rtol=1e-6
        )
    else:  # refused: its Δc_i never counted in c, so c_i stays as it was
        assert not held.exists()
    assert not list((tmp_path / "pending").iterdir())


def test_a_fedprox_client_passes_mu_to_the_engine(tmp_path: Path) -> None:
    ScaffoldEngine.seen = []
    prox = SPEC.model_copy(update={"drift_correction": DriftCorrectionSpec(name="fedprox", mu=0.2)})

    class Prox(FakeCoordinator):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/spec"):
                return httpx.Response(200, json=prox.model_dump(mode="json"))
            return super().__call__(request)

    _run_until_done(_agent(tmp_path, Prox(0), engine=ScaffoldEngine))
    (options,) = ScaffoldEngine.seen
    assert options["prox_mu"] == 0.2 and "correction" not in options and "mean_gradient" not in options


@pytest.mark.parametrize(
    ("labels", "scale"), [([0, 0, 0, 0], 0.0), ([0, 0, 0, 1], 0.8112781), ([0, 1, 0, 1], 1.0)]
)
def test_an_entropy_scaled_client_sends_its_update_shrunk_by_its_own_label_entropy(
    tmp_path: Path, labels: list[int], scale: float
) -> None:
    """Global prompt 1, three steps of +1: the update is 3. Four examples of one label send none of it
    (the upload is the global prompt); three and one: entropy 0.5623 nats / log 2 = 0.8113, so
    1 + 0.8113·3; two of each: 1 + 3."""
    spec = SPEC.model_copy(update={"drift_correction": DriftCorrectionSpec(entropy_scaling=True)})

    class Scaled(FakeCoordinator):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/spec"):
                return httpx.Response(200, json=spec.model_dump(mode="json"))
            return super().__call__(request)

    coordinator = Scaled(0)
    examples = [Example(text=f"t{i}", label=label) for i, label in enumerate(labels)]
    _run_until_done(_agent(tmp_path, coordinator, engine=ScaffoldEngine, examples=examples))
    tensors, meta = wire.decode(coordinator.uploads[-1])
    np.testing.assert_allclose(tensors["prompt_embeddings"], 1.0 + scale * 3.0, rtol=1e-6)
    assert "update_scale" not in meta["metrics"]  # the factor tells of the labels: it stays here


def test_a_worker_sends_heartbeats_while_its_model_loads(tmp_path: Path) -> None:
    quick = SPEC.model_copy(update={"availability_timeout_s": 1.0})  # heartbeats every 0.1 s
    assert quick.heartbeat_s == pytest.approx(0.1)

    class Coordinator(FakeCoordinator):
        def __call__(self, request: httpx.Request) -> httpx.Response:
            if request.url.path.endswith("/spec"):
                return httpx.Response(200, json=quick.model_dump(mode="json"))
            if request.url.path.endswith("/activity"):
                with self.lock:
                    self.calls.append(f"activity {json.loads(request.content)['phase']}")
                return httpx.Response(204)
            return super().__call__(request)

    def slow_engine(spec: FederationSpec, device: str) -> FakeEngine:
        time.sleep(0.45)  # a model that takes several heartbeats to load
        return FakeEngine()

    coordinator = Coordinator(fail_uploads=0)
    agent = _agent(tmp_path, coordinator)
    agent.engine_factory = slow_engine
    _run_until_done(agent)
    before_first_poll = coordinator.calls[
        : next(i for i, c in enumerate(coordinator.calls) if c.endswith("/task"))
    ]
    assert before_first_poll.count("activity idle") >= 3, before_first_poll
