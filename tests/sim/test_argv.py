"""The worker command lines and pool files simulate writes parse with the worker's own `pool` and `train-local`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import typer.main
from fedprompt.sim.argv import TrainLocal, WorkerPool, to_args
from fedprompt.sim.launch import Run, client_entry, pool_file
from fedprompt.worker.cli import pool, serve
from fedprompt.worker.pool import PoolConfig
from fedprompt.worker.train_local import train_local_command


@pytest.fixture(scope="module")
def worker_commands() -> dict[str, click.Command]:
    """`fedprompt-worker serve` and `train-local` as click commands (the worker CLI's own functions)."""
    app = typer.Typer()
    app.command("serve")(serve)
    app.command("pool")(pool)
    app.command("train-local")(train_local_command)
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _parsed(command: click.Command, argv: list[str]) -> dict[str, Any]:
    with command.make_context(command.name or "", argv) as ctx:
        return ctx.params


def test_to_args_writes_flags_for_set_options_only() -> None:
    options = {"rounds": 3, "seed": 0, "out": Path("x"), "baseline": True, "save_prompt": None, "dry": False}
    assert to_args(options | {"verbalizer": [["bad"], ["good"]]}) == [
        "--rounds", "3", "--seed", "0", "--out", "x", "--baseline", "--verbalizer", '[["bad"], ["good"]]',
    ]  # fmt: skip


def test_the_pool_command_line_parses_with_the_worker(
    worker_commands: dict[str, click.Command], tmp_path: Path
) -> None:
    pool = WorkerPool(config=tmp_path / "pool-0.json", port=8123)

    argv = pool.argv()

    assert Path(argv[0]).name == "fedprompt-worker" and argv[1] == "pool"
    params = _parsed(worker_commands["pool"], argv[2:])
    for field in dataclasses.fields(WorkerPool):
        assert params[field.name] == getattr(pool, field.name), field.name


def _run(tmp_path: Path) -> Run:
    return Run(tmp_path, {}, "admin", cores=2, parallel=2, threads=1, processes=2)


def test_malicious_clients_get_the_poisoning_and_honest_ones_only_the_asr_target(tmp_path: Path) -> None:
    setup = {
        "dataset": "sst2",
        "partition": "label:1.0",
        "clients": 4,
        "train_limit": 300,
        "eval_limit": None,
        "backdoor": {
            "malicious": 1,
            "poison_rate": 0.5,
            "target_label": 1,
            "trigger": "cf,mn",
            "trigger_position": "start",
            "attack": "boost:4",
        },
    }

    bad, good = client_entry(0, 1, setup, 7, _run(tmp_path)), client_entry(3, 1, setup, 7, _run(tmp_path))

    assert (bad.name, bad.partition_id, bad.num_partitions, bad.seed) == ("client-0", 0, 4, 7)
    assert bad.state_dir == tmp_path / "workers" / "0" and bad.train_limit == 300 and bad.eval_limit is None
    assert bad.backdoor is not None and (bad.backdoor.poison_rate, bad.backdoor.attack) == (0.5, "boost:4")
    assert good.backdoor is not None and (good.backdoor.poison_rate, good.backdoor.attack) == (0.0, "none")
    assert good.backdoor.target_label == 1 and good.backdoor.trigger_position == "start"


def test_a_clean_federation_measures_no_asr_unless_asked_and_every_client_gets_its_own_ldp_seed(
    tmp_path: Path,
) -> None:
    door = {
        "malicious": 0,
        "poison_rate": 1.0,
        "target_label": 0,
        "trigger": "cf",
        "trigger_position": "random",
    }
    setup = {"dataset": "sst2", "partition": "iid", "clients": 3, "backdoor": door | {"attack": "none"}}

    clean = [client_entry(i, 1, setup, 5, _run(tmp_path)) for i in range(3)]
    asked = client_entry(
        0, 1, setup | {"backdoor": setup["backdoor"] | {"measure_asr": True}}, 5, _run(tmp_path)
    )

    assert all(c.backdoor is None for c in clean)  # no backdoor configured: no ASR anywhere
    assert asked.backdoor is not None and asked.backdoor.poison_rate == 0.0  # --measure-asr: clean triggers
    assert len({c.ldp_seed for c in clean}) == 3  # reproducible noise, different per client
    assert client_entry(1, 1, setup, 5, _run(tmp_path)).ldp_seed == clean[1].ldp_seed
    assert client_entry(1, 1, setup, 6, _run(tmp_path)).ldp_seed != clean[1].ldp_seed


def test_pool_files_are_private_and_read_back_by_the_worker(tmp_path: Path) -> None:
    setup = {"dataset": "sst2", "partition": "iid", "clients": 2, "backdoor": {}, "slowdowns": [1.0, 2.5]}
    members = [client_entry(i, 5, setup, 0, _run(tmp_path)) for i in range(2)]

    path = pool_file(0, "http://127.0.0.1:9", 5, "fpe_secret", members, _run(tmp_path), "cpu")

    assert path.stat().st_mode & 0o777 == 0o600
    back = PoolConfig.read(path)
    assert back.federation == 5 and back.enrollment_token == "fpe_secret" and back.threads == 1
    assert [c.name for c in back.clients] == ["client-0", "client-1"]
    assert all(c.backdoor is None for c in back.clients)
    assert [c.slowdown for c in back.clients] == [1.0, 2.5]  # --client-speed, client by client


def test_without_client_speed_every_client_runs_at_full_speed(tmp_path: Path) -> None:
    setup = {"dataset": "sst2", "partition": "iid", "clients": 2, "backdoor": {}, "slowdowns": None}
    assert [client_entry(i, 5, setup, 0, _run(tmp_path)).slowdown for i in range(2)] == [1.0, 1.0]
    del setup["slowdowns"]  # a simulation.json from before --client-speed
    assert client_entry(1, 5, setup, 0, _run(tmp_path)).slowdown == 1.0


def test_the_baseline_command_parses_with_train_local(
    worker_commands: dict[str, click.Command], tmp_path: Path
) -> None:
    baseline = TrainLocal(
        dataset="sst2",
        model="sentence-transformers/all-MiniLM-L6-v2",
        steps=40,
        batch_size=8,
        lr=0.3,
        num_virtual_tokens=20,
        max_length=48,
        seed=0,
        template="{text} It was [MASK].",
        verbalizer=[["bad"], ["good"]],
        eval_every=0,
        out=tmp_path / "baseline.json",
        train_limit=300,
        eval_limit=60,
    )
    argv = baseline.argv()
    assert argv[1] == "train-local"
    params = _parsed(worker_commands["train-local"], argv[2:])
    for field in dataclasses.fields(TrainLocal):
        expected = getattr(baseline, field.name)
        if field.name == "verbalizer":  # train-local reads the JSON text itself
            assert params[field.name] == '[["bad"], ["good"]]'
        else:
            assert params[field.name] == expected, field.name
