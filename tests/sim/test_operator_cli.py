"""The operator CLI: wait commands with progress, --json everywhere, shell completion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.db import Client
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.shared.client import CoordinatorClient
from fedprompt.sim import operator_cli
from sqlalchemy import select
from typer.testing import CliRunner

from tests.coordinator.conftest import FakeClock
from tests.helpers import ADMIN, SMALL_SPEC, update_blob

ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}
BASE = ["--coordinator", "http://testserver", "--token", ADMIN]


class World:
    """An in-process coordinator the CLI talks to, a federation with 2 clients, and a fake clock."""

    def __init__(self, api: TestClient) -> None:
        self.api = api
        spec = {**SMALL_SPEC, "rounds": 2}
        self.fid = api.post("/api/v1/federations", json=spec, headers=ADMIN_H).json()["id"]
        token = api.post(f"/api/v1/federations/{self.fid}/enrollment-tokens", json={}, headers=ADMIN_H)
        self.clients = []
        for i in range(2):
            r = api.post(
                f"/api/v1/federations/{self.fid}/clients",
                json={"name": f"site-{i}", "num_samples": 10},
                headers={"Authorization": f"Bearer {token.json()['token']}"},
            ).json()
            self.clients.append({"Authorization": f"Bearer {r['token']}"})
        self.now = 0.0

    def upload(self, number: int, i: int) -> None:
        """Client i uploads for round `number`."""
        body = update_blob(SMALL_SPEC, 10 * number + i, base_version=number - 1)
        resp = self.api.put(
            f"/api/v1/federations/{self.fid}/rounds/{number}/update", content=body, headers=self.clients[i]
        )
        assert resp.status_code == 201, resp.text

    def script(self, monkeypatch: pytest.MonkeyPatch, steps: list[Callable[[], None]]) -> list[float]:
        """Each poll's sleep runs the next step (then nothing); returns the sleeps asked for."""
        pending, slept = list(steps), []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            self.now += seconds
            if pending:
                pending.pop(0)()

        monkeypatch.setattr(operator_cli, "_sleep", sleep)
        monkeypatch.setattr(operator_cli, "_monotonic", lambda: self.now)
        return slept


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade(url)
    app = create_app(Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path), sweep=False)
    with TestClient(app) as api:

        def client(base: str, token: str | None) -> CoordinatorClient:
            c = CoordinatorClient(base, token)
            c.http.close()
            c.http = TestClient(app, base_url=base, headers={"Authorization": f"Bearer {token}"})
            return c

        monkeypatch.setattr(operator_cli, "_client", client)
        yield World(api)


def run(*args: str) -> Any:
    """Invoke `fedprompt ARGS` in-process."""
    return CliRunner().invoke(operator_cli.app, [*args, *BASE])


def test_round_wait_follows_uploads_until_the_round_closes(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    slept = world.script(monkeypatch, [lambda: world.upload(1, 0), lambda: world.upload(1, 1)])
    result = run("round", "wait", "-f", str(world.fid), "--interval", "5", "--json")
    assert result.exit_code == 0, result.output
    rnd = json.loads(result.stdout)
    assert rnd["round"] == 1 and rnd["state"] == "closed" and rnd["closed_by"] == "all-uploaded"
    assert slept == [5, 5]  # polled three times: 0/2, 1/2, closed


def test_round_wait_times_out_with_exit_code_3(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.script(monkeypatch, [])
    result = run("round", "wait", "-f", str(world.fid), "1", "--timeout", "3", "--interval", "1")
    assert result.exit_code == operator_cli.EXIT_TIMEOUT
    assert "round 1 is open after 3 s" in result.output


def test_round_wait_rejects_a_round_beyond_the_federation(world: World) -> None:
    result = run("round", "wait", "-f", str(world.fid), "9")
    assert result.exit_code == 2 and "only 2 rounds" in result.output


def test_round_wait_keeps_waiting_through_a_failed_attempt(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prepare: the deadline of attempt 1 passes with no upload; the sweep retries with attempt 2
    clock = FakeClock()
    service = world.api.app.state.service
    service.clock = clock

    def fail_attempt_1() -> None:
        clock.now = 1e12  # far past the deadline; clients stay available
        with service.sessions() as s, s.begin():
            for c in s.scalars(select(Client)).all():
                c.last_seen_at = clock.now
        service.cycle.sweep()

    world.script(monkeypatch, [fail_attempt_1, lambda: world.upload(1, 0), lambda: world.upload(1, 1)])

    # Execute
    result = run("round", "wait", "-f", str(world.fid), "1", "--json")

    # Assert
    assert result.exit_code == 0, result.output
    rnd = json.loads(result.stdout)
    assert (rnd["attempt"], rnd["state"]) == (2, "closed")


def test_federation_wait_until_completed_prints_the_rounds(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = [lambda: world.upload(1, 0), lambda: world.upload(1, 1), lambda: world.upload(2, 0)]
    steps.append(lambda: world.upload(2, 1))
    world.script(monkeypatch, steps)
    result = run("federation", "wait", "-f", str(world.fid), "--interval", "1", "--eval-wait", "0")
    assert result.exit_code == 0, result.output
    assert "rounds" in result.stdout and "closed" in result.stdout  # the rich rounds table
    as_json = run("federation", "wait", "-f", str(world.fid), "--json")
    assert json.loads(as_json.stdout)["state"] == "completed"


def test_federation_wait_until_a_round_times_out(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.script(monkeypatch, [lambda: world.upload(1, 0)])
    result = run("federation", "wait", "-f", str(world.fid), "--round", "1", "--timeout", "2")
    assert result.exit_code == operator_cli.EXIT_TIMEOUT
    assert "round 1 1/2 uploaded" in result.output


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["federation", "status"], None),
        (["federation", "pause", "-f", "{fid}"], "paused"),
        (["federation", "resume", "-f", "{fid}"], "paused"),
        (["clients", "list", "-f", "{fid}"], None),
        (["rounds", "list", "-f", "{fid}"], None),
        (["token", "create", "-f", "{fid}"], "token"),
        (["clients", "revoke", "-f", "{fid}", "2"], "revoked"),
        (["prompt", "get", "-f", "{fid}", "--version", "0", "--out", "{tmp}/p.safetensors"], "sha256"),
        (["round", "open", "-f", "{fid}"], None),  # round 1 already open: an error, no JSON
    ],
)
def test_json_output_of_every_command(world: World, tmp_path: Path, args: list[str], key: str | None) -> None:
    argv = [a.format(fid=world.fid, tmp=tmp_path) for a in args]
    result = run(*argv, "--json")
    if argv[:2] == ["round", "open"]:
        assert result.exit_code == 1 and "still open" in result.output
        return
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    if key is not None:
        assert key in data


LOCAL_COMMANDS = {"simulate", "demo", "train-local", "experiment", "data"}  # no coordinator to answer


def test_every_command_takes_json() -> None:
    import typer.main

    group = typer.main.get_command(operator_cli.app)
    missing = []
    for name, sub in group.commands.items():  # type: ignore[attr-defined]
        if name in LOCAL_COMMANDS:
            continue
        for cname, cmd in getattr(sub, "commands", {name: sub}).items():
            if "--json" not in [o for p in cmd.params for o in p.opts]:
                missing.append(f"{name} {cname}")
    assert missing == []


def test_shell_completion_completes_commands() -> None:
    exe = str(Path(sys.executable).parent / "fedprompt")
    env = {
        **os.environ,
        "_FEDPROMPT_COMPLETE": "complete_bash",
        "COMP_WORDS": "fedprompt round ",
        "COMP_CWORD": "2",
    }
    done = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert {"open", "close", "wait"} <= set(done.stdout.split())
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--install-completion" in helptext
