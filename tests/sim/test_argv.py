"""The worker command lines simulate writes parse with the worker's own `serve` and `train-local`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import pytest
import typer
import typer.main

from sim.argv import TrainLocal, WorkerServe, to_args
from worker.cli import serve
from worker.train_local import train_local_command


@pytest.fixture(scope="module")
def worker_commands() -> dict[str, click.Command]:
    """`fedprompt-worker serve` and `train-local` as click commands (the worker CLI's own functions)."""
    app = typer.Typer()
    app.command("serve")(serve)
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


def test_every_serve_option_simulate_sets_is_one_the_worker_parses(
    worker_commands: dict[str, click.Command], tmp_path: Path
) -> None:
    site = WorkerServe(
        coordinator="http://127.0.0.1:9",
        federation=3,
        enrollment_token="tok",
        data="sst2",
        partition="quantity:0.5",
        num_partitions=4,
        partition_id=2,
        seed=7,
        state_dir=tmp_path / "w2",
        port=8123,
        name="client-2",
        threads=2,
        slots_dir=tmp_path / "slots",
        slots=2,
        device="cpu",
        target_label=1,
        trigger="cf,mn",
        trigger_position="start",
        poison_rate=0.5,
        attack="boost:4",
        train_limit=300,
        eval_limit=60,
    )
    argv = site.argv()
    assert Path(argv[0]).name == "fedprompt-worker" and argv[1] == "serve"
    params = _parsed(worker_commands["serve"], argv[2:])
    for field in dataclasses.fields(WorkerServe):  # every field set above is an option of serve
        assert params[field.name] == getattr(site, field.name), field.name


def test_an_honest_site_gets_no_poisoning_options(worker_commands: dict[str, click.Command]) -> None:
    site = WorkerServe(
        coordinator="http://127.0.0.1:9",
        federation=1,
        enrollment_token="tok",
        data="sst2",
        partition="iid",
        num_partitions=2,
        partition_id=0,
        seed=0,
        state_dir=Path("w0"),
        port=8100,
        name="client-0",
        threads=1,
        slots_dir=Path("slots"),
        slots=1,
    )
    argv = site.argv()
    assert "--poison-rate" not in argv and "--attack" not in argv and "--train-limit" not in argv
    params = _parsed(worker_commands["serve"], argv[2:])
    assert params["poison_rate"] == 0.0 and params["attack"] == "none" and params["log_level"] == "warning"


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
