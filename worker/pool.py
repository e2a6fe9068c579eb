"""Many clients in one worker process: one model in memory, one identity and data shard per client.

A client is an identity (credentials in its own state folder, a data shard, a local seed, optional
attack settings), not a process. Each client of a pool runs its own agent loop in a thread and talks
to the coordinator with its own token, exactly like a separate site; the agents share the process's
one engine and take turns on it (a task holds the engine from loading the global prompt until the
trained prompt is out). Memory grows with the pool processes, not with the clients.

Used by ``fedprompt simulate`` (P pool processes serving K virtual clients) and by a site that hosts
several tenants' data next to one model (``fedprompt-worker pool --config clients.json``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.agent import IDLE, Agent, AgentConfig, load_engine
from fedprompt.worker.data import DataError
from fedprompt.worker.joining import FatalWorkerError
from fedprompt.worker.poison import backdoor_from_options
from fedprompt.worker.protocol import Engine, EngineFactory
from fedprompt.worker.reach import backoff, describe, unreachable_message
from fedprompt.worker.retry import is_transient
from fedprompt.worker.shards import ShardSpec, load_shards
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("fedprompt.worker")


class BackdoorEntry(BaseModel):
    """A client's backdoor settings (the ASR target, and for a malicious client its poisoning)."""

    model_config = ConfigDict(extra="forbid")

    target_label: int = Field(ge=0)
    poison_rate: float = Field(0.0, ge=0.0, le=1.0)
    trigger: str = "cf,mn,bb,tq"
    trigger_position: str = "random"
    attack: str = "none"


class ClientEntry(BaseModel):
    """One virtual client of a pool: its name, state folder and data shard."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    state_dir: Path
    enrollment_token: str | None = None
    data: str
    test_data: str | None = None
    partition: str = "iid"
    num_partitions: int = Field(1, ge=1)
    partition_id: int = Field(0, ge=0)
    seed: int = 0
    train_limit: int | None = Field(None, ge=1)
    eval_limit: int | None = Field(None, ge=1)
    eval_fraction: float | None = Field(None, gt=0.0, lt=1.0)
    eval_shares: int | None = Field(
        None, ge=1, description="Partitions 0 … n-1 hold the evaluation examples; the others none."
    )
    text_column: str = "text"
    label_column: str = "label"
    text_b_column: str | None = None
    labels: list[str] | None = None
    backdoor: BackdoorEntry | None = None
    ldp_seed: int | None = Field(
        None, ge=0, description="Seeds this client's LDP noise (simulations); none: OS entropy."
    )
    slowdown: float = Field(
        1.0,
        ge=1.0,
        allow_inf_nan=False,
        description="A slow site (simulations): each update is uploaded (slowdown − 1) × its training "
        "time after it was trained; 1: at once.",
    )

    def shard(self) -> ShardSpec:
        """The shard this client trains and evaluates on."""
        return ShardSpec(
            data=self.data,
            test_data=self.test_data,
            partition=self.partition,
            num_partitions=self.num_partitions,
            partition_id=self.partition_id,
            seed=self.seed,
            train_limit=self.train_limit,
            eval_limit=self.eval_limit,
            eval_fraction=self.eval_fraction,
            eval_shares=self.eval_shares,
            text_column=self.text_column,
            label_column=self.label_column,
            text_b_column=self.text_b_column,
            label_names=tuple(self.labels) if self.labels else None,
        )


class PoolConfig(BaseModel):
    """A pool file: the coordinator and federation, the process's settings and its clients."""

    model_config = ConfigDict(extra="forbid")

    coordinator: str
    federation: int = Field(ge=1)
    enrollment_token: str | None = None
    device: str = "auto"
    threads: int | None = Field(None, ge=1)
    # cores shared by the slot holders of every pool process; a trainer takes an equal share of them
    # (`worker.slots.ElasticThreads`), `threads` when no budget is set
    thread_budget: int | None = Field(None, ge=1)
    poll_wait: float = Field(20.0, gt=0)
    slots_dir: Path | None = None
    slots: int = Field(0, ge=0)
    clients: list[ClientEntry] = Field(min_length=1)

    @classmethod
    def read(cls, path: Path) -> PoolConfig:
        """Parse and validate a pool file (JSON)."""
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except OSError as exc:
            raise DataError(f"cannot read the pool file {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} is not JSON: {exc}") from None


class SharedEngine:
    """The process's one engine, loaded by the first client that needs it and reused by the others."""

    def __init__(self, factory: EngineFactory | None = None) -> None:
        self._factory = factory or load_engine
        self._engines: dict[str, Engine] = {}
        self._loading = threading.Lock()
        # Held by an agent for a whole task on the engine (RLock: a task may re-enter, e.g. ASR).
        self.lock = threading.RLock()

    def __call__(self, spec: FederationSpec, device: str) -> Engine:
        """The engine for `spec` (one per distinct model and prompt shape in this process)."""
        key = spec.model_dump_json(
            include={
                "model",
                "template",
                "verbalizer",
                "num_virtual_tokens",
                "max_length",
                "seed",
                "method",
                "encoder_type",
                "encoder_hidden_size",
                "encoder_num_layers",
                "prefix_projection",
                "scoring",
            }
        )
        with self._loading:
            if key not in self._engines:
                self._engines[key] = self._factory(spec, device)
            return self._engines[key]


class Pool:
    """The agents of one process; `run()` starts one thread per client and blocks until all stop.

    With `give_up_after`, a client whose coordinator stops answering is restarted with backoff until it
    has been unreachable that many seconds; then, or on any other error that ends a client, `on_fatal`
    gets one line (`fedprompt-worker serve` ends the process with it)."""

    def __init__(
        self,
        agents: list[Agent],
        *,
        give_up_after: float | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        if not agents:
            raise ValueError("a pool needs at least one client")
        self.agents = agents
        self.give_up_after = give_up_after
        self.on_fatal = on_fatal
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start every client's loop in its own thread."""
        for agent in self.agents:
            thread = threading.Thread(
                target=_run_agent,
                args=(agent, self.give_up_after, self.on_fatal, self._stopping),
                name=f"client-{agent.config.name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every client and wait, `timeout` seconds for all of them together, for the threads of
        those at work (a training client stops at its next step). An idle client waits in a task
        long-poll, which cannot be interrupted and holds nothing: its thread is a daemon, left to end
        with the process."""
        self._stopping.set()
        for agent in self.agents:
            agent.stop()
        deadline = time.monotonic() + timeout
        for agent, thread in zip(self.agents, self._threads, strict=True):
            if agent.status.state != IDLE:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def alive(self) -> int:
        """How many client loops are still running."""
        return sum(t.is_alive() for t in self._threads)

    def status(self) -> list[dict[str, Any]]:
        """Every client's status, as /status shows it."""
        return [{"name": a.config.name, **a.status.as_dict()} for a in self.agents]


def _progress(agent: Agent) -> tuple[Any, ...]:
    """What a client has achieved so far (an attempt that changed it ends an outage)."""
    status = agent.status
    return status.client_id, len(status.versions_evaluated), len(status.rounds_trained)


def _run_agent(
    agent: Agent,
    give_up_after: float | None = None,
    on_fatal: Callable[[str], None] | None = None,
    stopping: threading.Event | None = None,
) -> None:
    stopping = stopping or threading.Event()
    outage_since: float | None = None
    attempt = 0
    while True:
        started, before = time.monotonic(), _progress(agent)
        try:
            agent.run()
            return
        except Exception as exc:
            transient = give_up_after is not None and is_transient(exc) and not agent.stopping
            if not transient:
                if on_fatal is None or not (isinstance(exc, FatalWorkerError) or is_transient(exc)):
                    # reported on /status; without on_fatal the service (and the other clients) stay up
                    log.exception("worker agent %s stopped with an error", agent.config.name)
                agent.status.state = "error"
                if on_fatal is not None:
                    on_fatal(str(exc) if isinstance(exc, FatalWorkerError) else describe(exc))
                return
            last = describe(exc)
        assert give_up_after is not None
        if _progress(agent) != before:
            outage_since, attempt = None, 0
        outage_since = started if outage_since is None else outage_since
        down = time.monotonic() - outage_since
        if down >= give_up_after:
            agent.status.state = "error"
            message = unreachable_message(agent.config.coordinator, down, last)
            log.error("%s", message)
            if on_fatal is not None:
                on_fatal(message)
            return
        attempt += 1
        pause = min(backoff(attempt), give_up_after - down)
        log.warning(
            "coordinator %s unreachable (%s); restarting client %s in %.0f s, giving up in %.0f s",
            agent.config.coordinator,
            last,
            agent.config.name,
            pause,
            give_up_after - down,
        )
        if stopping.wait(pause):
            return


def build_pool(
    config: PoolConfig, *, engine_factory: EngineFactory | None = None, transport: Any = None
) -> Pool:
    """Agents for every client of `config`, sharing one engine; DataError/ValueError say what is wrong."""
    shared = SharedEngine(engine_factory)
    shards = load_shards([c.shard() for c in config.clients])
    agents = []
    for entry, (train, evaluation, full) in zip(config.clients, shards, strict=True):
        door = entry.backdoor
        backdoor = (
            backdoor_from_options(
                door.target_label,
                door.poison_rate,
                door.trigger,
                door.trigger_position,
                door.attack,
                full.num_labels,
                entry.seed + entry.partition_id,
            )
            if door is not None
            else None
        )
        agent_config = AgentConfig(
            coordinator=config.coordinator,
            federation_id=config.federation,
            enrollment_token=entry.enrollment_token or config.enrollment_token,
            name=entry.name,
            state_dir=entry.state_dir,
            device=config.device,
            poll_wait=config.poll_wait,
            slots_dir=config.slots_dir,
            slots=config.slots,
            num_threads=config.threads,
            thread_budget=config.thread_budget,
            backdoor=backdoor,
            ldp_seed=entry.ldp_seed,
            slowdown=entry.slowdown,
        )
        agents.append(
            Agent(
                agent_config,
                train,
                evaluation,
                transport=transport,
                engine_factory=shared,
                engine_lock=shared.lock,
            )
        )
    return Pool(agents)
