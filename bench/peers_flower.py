"""The same federation as a `fedprompt simulate` run, under Flower's simulation engine (flwr, Ray).

Runs in its own virtual environment (`make bench-peers` builds `.venv-peers`: flwr[simulation] pins
other versions of fastapi, starlette, typer and rich than fedprompt's), driven by `bench/peers.py`:

    .venv-peers/bin/python -m bench.peers_flower --run RUN_FOLDER --out flower.json

RUN_FOLDER is a finished `fedprompt simulate` run of the same repeat: its `results.json` gives the
federation spec (model, method, template, verbaliser, rounds, fraction, local steps, batch size, lr,
seed) and its `simulation.json` the data set and partition; its SQLite file gives the starting prompt
(version 0). The work is then the same, step for step:

- each virtual client trains fedprompt's own `PromptEngine` on fedprompt's own shard of the data
  (`worker.shards.load_shard`, the same partition id), with the same per-(round, client) seed;
- the clients of each round are the ones fedprompt's coordinator selects (`select_clients`, the same
  seed; the node → partition map is learnt by one query message to every node before round 1);
- the server averages the prompts weighted by the clients' example counts (Flower's FedAvg);
- each version, the initial one included, is evaluated on the whole test split, as fedprompt's
  single evaluator client does (`--evaluators 1`): here by the ServerApp (`evaluate_fn`, Flower's
  centralised evaluation), which therefore holds a copy of the model.

Ray runs one actor per CPU (`client_resources.num_cpus = 1`), each with one torch thread, as
fedprompt's pools run one training slot per CPU with one thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fedprompt.coordinator.logic.selection import select_clients
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.wire import decode
from fedprompt.worker.agent import round_seed
from fedprompt.worker.engine import PromptEngine
from fedprompt.worker.shards import ShardSpec, load_shard, load_shards
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.app.message_type import MessageType
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

# The run this process reproduces; the ClientApp's actors read it from the environment (Ray passes it on).
_RUN_ENV = "FEDPROMPT_PEERS_RUN"


def _setup(run: Path) -> tuple[FederationSpec, dict[str, Any], dict[str, np.ndarray]]:
    """The spec, the set-up (data set, partition, limits) and the starting prompt of a fedprompt run."""
    results = json.loads((run / "results.json").read_text())
    setup = json.loads((run / "simulation.json").read_text())
    spec = FederationSpec.model_validate(results["spec"])
    con = sqlite3.connect(next(run.glob("*.db")))
    try:
        (blob,) = con.execute("select blob from prompt_versions where version = 0").fetchone()
    finally:
        con.close()
    return spec, setup, decode(blob)[0]


def _shard(setup: dict[str, Any], spec: FederationSpec, partition_id: int) -> ShardSpec:
    """Client `partition_id`'s shard as fedprompt's simulate cuts it; partition 0 holds the whole test
    split (fedprompt's `--evaluators 1`; the training shards do not depend on it)."""
    return ShardSpec(
        data=setup["dataset"],
        partition=setup["partition"],
        num_partitions=int(setup["clients"]),
        partition_id=partition_id,
        seed=spec.seed,
        train_limit=setup.get("train_limit") or None,
        eval_limit=setup.get("eval_limit") or None,
        eval_shares=1,
    )


class _Actor:
    """What one Ray actor keeps between messages: the model and every client's training shard, loaded
    once, as each fedprompt worker pool loads its members' shards at start."""

    engine: Any = None
    spec: FederationSpec | None = None
    shards: list[list[Any]] = []


def _actor() -> type[_Actor]:
    if _Actor.engine is None:
        torch.set_num_threads(1)
        spec, setup, _ = _setup(Path(os.environ[_RUN_ENV]))
        _Actor.spec = spec
        _Actor.engine = PromptEngine.from_spec(spec, device="cpu")
        specs = [_shard(setup, spec, i) for i in range(int(setup["clients"]))]
        _Actor.shards = [train for train, _, _ in load_shards(specs)]
    return _Actor


client_app = ClientApp()


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    """Which partition this node holds (the server maps fedprompt's client ids to node ids with it)."""
    pid = int(context.node_config["partition-id"])
    return Message(RecordDict({"config": ConfigRecord({"partition-id": pid})}), reply_to=msg)


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """fedprompt's local round: load the global prompt, train `local_steps` on the shard, send the prompt."""
    actor = _actor()
    spec = actor.spec
    assert spec is not None
    pid = int(context.node_config["partition-id"])
    examples = actor.shards[pid]
    number = int(msg.content["config"]["server-round"])
    arrays = msg.content["arrays"].to_torch_state_dict()
    actor.engine.set_prompt({n: t.numpy() for n, t in arrays.items()})
    result = actor.engine.train(
        examples,
        steps=spec.local_steps,
        batch_size=spec.batch_size,
        lr=spec.lr,
        optimizer=spec.local_optimizer,
        grad_clip=spec.grad_clip,
        seed=round_seed(spec.seed, number, pid + 1),  # fedprompt's client ids are 1 … K in enrolment order
    )
    prompt = {
        n: torch.from_numpy(np.asarray(a, dtype=np.float32)) for n, a in actor.engine.get_prompt().items()
    }
    metrics = MetricRecord(
        {"num-examples": len(examples), "train_s": float(result.seconds), "client": pid + 1}
    )
    return Message(RecordDict({"arrays": ArrayRecord(prompt), "metrics": metrics}), reply_to=msg)


class SameSelection(FedAvg):
    """Flower's FedAvg with fedprompt's selection of clients, and each round's wall time recorded."""

    def __init__(self, spec: FederationSpec, num_clients: int) -> None:
        super().__init__(fraction_train=spec.fraction, fraction_evaluate=0.0, min_available_nodes=num_clients)
        self.spec, self.num_clients = spec, num_clients
        self.node_of: dict[int, int] = {}  # fedprompt client id (partition + 1) -> Flower node id
        self.rounds: dict[int, dict[str, Any]] = {}

    def _map_nodes(self, grid: Grid) -> None:
        while len(nodes := list(grid.get_node_ids())) < self.num_clients:
            time.sleep(0.1)
        asks = [
            Message(RecordDict({"config": ConfigRecord()}), dst_node_id=n, message_type=MessageType.QUERY)
            for n in nodes
        ]
        for reply in grid.send_and_receive(asks):
            pid = int(reply.content["config"]["partition-id"])
            self.node_of[pid + 1] = reply.metadata.src_node_id

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        if not self.node_of:
            self._map_nodes(grid)
        ids = sorted(self.node_of)
        chosen = select_clients(
            ids, self.spec.num_selected(len(ids)), seed=self.spec.seed, round_number=server_round, attempt=1
        )
        self.rounds[server_round] = {"opened": time.perf_counter(), "clients": chosen}
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return list(self._construct_messages(record, [self.node_of[c] for c in chosen], MessageType.TRAIN))

    def aggregate_train(
        self, server_round: int, replies: Any
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        out = super().aggregate_train(server_round, replies)
        entry = self.rounds[server_round]
        entry["aggregated"] = time.perf_counter()
        entry["train_s"] = [float(r.content["metrics"]["train_s"]) for r in replies if not r.has_error()]
        entry["errors"] = sum(1 for r in replies if r.has_error())
        return out


def server_app(out: Path) -> ServerApp:
    run = Path(os.environ[_RUN_ENV])
    spec, setup, initial = _setup(run)
    num_clients = int(setup["clients"])
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        torch.set_num_threads(1)
        engine = PromptEngine.from_spec(spec, device="cpu")
        test = load_shard(_shard(setup, spec, 0))[1]
        evaluations: dict[int, dict[str, float]] = {}

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            started = time.perf_counter()
            engine.set_prompt({n: t.numpy() for n, t in arrays.to_torch_state_dict().items()})
            result = engine.evaluate(test)
            evaluations[server_round] = {
                "accuracy": float(result.accuracy),
                "seconds": time.perf_counter() - started,
            }
            return MetricRecord({"accuracy": float(result.accuracy)})

        strategy = SameSelection(spec, num_clients)
        start = ArrayRecord({n: torch.from_numpy(np.asarray(a, np.float32)) for n, a in initial.items()})
        started = time.perf_counter()
        strategy.start(grid=grid, initial_arrays=start, num_rounds=spec.rounds, evaluate_fn=evaluate)
        rounds = [
            {
                "round": n,
                "clients": r["clients"],
                "seconds": r["aggregated"] - r["opened"],
                "train_s": r["train_s"],
                "errors": r["errors"],
                "accuracy": evaluations[n]["accuracy"],
                "eval_seconds": evaluations[n]["seconds"],
            }
            for n, r in sorted(strategy.rounds.items())
        ]
        out.write_text(
            json.dumps(
                {
                    "initial_accuracy": evaluations[0]["accuracy"],
                    "final_accuracy": evaluations[spec.rounds]["accuracy"],
                    "federation_seconds": time.perf_counter() - started,
                    "rounds": rounds,
                },
                indent=2,
            )
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run", type=Path, required=True, help="the fedprompt simulate run folder to reproduce"
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write this run's JSON")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="Ray actors (one CPU each)")
    args = parser.parse_args()
    os.environ[_RUN_ENV] = str(args.run.resolve())
    setup = json.loads((args.run / "simulation.json").read_text())
    run_simulation(
        server_app=server_app(args.out),
        client_app=client_app,
        num_supernodes=int(setup["clients"]),
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.cpus, "include_dashboard": False},
        },
    )


if __name__ == "__main__":
    main()
