# ruff: noqa: F811 (the world fixture is imported from test_operator_cli)
"""One shape for the three command lines (issue 34): --version, -h, flags shown as flags, one name per
concept (old spellings still accepted, unlisted), one spelling of "enrollment", tables that a pipe
gets whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from fedprompt.coordinator import cli as coordinator_cli
from fedprompt.sim import operator_cli
from fedprompt.worker import cli as worker_cli
from typer.testing import CliRunner

from fedprompt import __version__
from tests.sim.test_operator_cli import ADMIN, World, world  # noqa: F401 (the fixture)

BIN = Path(sys.executable).parent
operator_cli.register_all()  # every command, as the console entry points have them
worker_cli._register()
APPS = {
    "fedprompt": operator_cli.app,
    "fedprompt-coordinator": coordinator_cli.app,
    "fedprompt-worker": worker_cli.app,
}


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    for name, sub in getattr(group, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


@pytest.mark.parametrize("name", list(APPS))
def test_every_cli_prints_its_version(name: str) -> None:
    done = subprocess.run([str(BIN / name), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"fedprompt {__version__}"


@pytest.mark.parametrize("name", list(APPS))
def test_dash_h_is_help_everywhere_and_flags_take_no_value(name: str) -> None:
    root = typer.main.get_command(APPS[name])
    runner = CliRunner()
    checked = 0
    for path, command in _commands(root):
        done = runner.invoke(APPS[name], [*path, "-h"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (path, done.output)
        assert "Usage:" in done.output and "<bool>" not in done.output, (path, done.output)
        assert "enrolment" not in done.output.lower(), (path, done.output)  # the API's spelling only
        flags = [p for p in command.params if getattr(p, "is_flag", False) and not p.hidden]
        for flag in flags:
            assert flag.opts[0] in done.output, (path, flag.opts)
            checked += 1
    assert checked > 0  # every CLI has flags (--dev, --json, --baseline, ...): the check saw them


def test_the_coordinator_address_is_one_name_with_the_old_one_unlisted(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    help_text = CliRunner().invoke(operator_cli.app, ["rounds", "list", "-h"], env={"COLUMNS": "200"}).output
    assert "--coordinator" in help_text and "FEDPROMPT_COORDINATOR" in help_text
    assert "--url" not in help_text and "FEDPROMPT_URL" not in help_text
    for args in (
        ["--url", "http://testserver"],
        ["--url=http://testserver"],
        ["--coordinator", "http://testserver"],
    ):
        done = CliRunner().invoke(
            operator_cli.app, ["rounds", "list", "-f", str(world.fid), *args, "--token", ADMIN]
        )
        assert done.exit_code == 0, (args, done.output)
    seen: list[str] = []
    real = operator_cli._client
    monkeypatch.setattr(operator_cli, "_client", lambda url, token: (seen.append(url), real(url, token))[1])
    monkeypatch.delenv("FEDPROMPT_COORDINATOR", raising=False)
    monkeypatch.setenv("FEDPROMPT_URL", "http://testserver")
    done = CliRunner().invoke(operator_cli.app, ["rounds", "list", "-f", str(world.fid), "--token", ADMIN])
    assert done.exit_code == 0, done.output
    assert seen == ["http://testserver"]
    # the old name is read for that invocation only: the caller's environment is left as it was
    assert "FEDPROMPT_COORDINATOR" not in os.environ


def test_the_old_thread_and_token_spellings_of_the_worker_still_parse() -> None:
    runner = CliRunner()
    for args in (["train-local", "--num-threads", "2"], ["serve", "--enrolment-token", "x"]):
        done = runner.invoke(worker_cli.app, [*args, "--no-such-flag"])
        assert "No such option: --no-such-flag" in done.output, done.output  # the alias itself parsed
    help_text = runner.invoke(worker_cli.app, ["train-local", "-h"], env={"COLUMNS": "200"}).output
    assert "--threads" in help_text and "--num-threads" not in help_text


def test_a_piped_table_is_plain_and_whole(world: World) -> None:
    done = CliRunner().invoke(
        operator_cli.app,
        ["rounds", "list", "-f", str(world.fid), "--coordinator", "http://testserver", "--token", ADMIN],
        env={"COLUMNS": "40"},
    )
    assert done.exit_code == 0, done.output
    header = next(line for line in done.output.splitlines() if "round" in line and "attempt" in line)
    for column in (
        "round",
        "attempt",
        "state",
        "participants",
        "uploaded",
        "accuracy",
        "train loss",
        "bytes up",
    ):
        assert column in header, header
    assert "…" not in done.output and "─" not in done.output  # no cut cell, no box drawing


def test_a_bad_setting_from_the_environment_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDPROMPT_WORKER_PORT", "eighty")
    done = CliRunner().invoke(worker_cli.app, ["pool", "--config", "pool.json"])
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == [
        "error: FEDPROMPT_WORKER_PORT='eighty' (--port): Input should be a valid integer, unable to parse "
        "string as an integer"
    ]
