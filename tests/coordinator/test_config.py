"""Settings and start-up: the admin token is required unless --dev, which writes a 0600 file."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from fedprompt.coordinator.config import ConfigError, Settings, require_admin_token

from tests.helpers import coordinator_cmd


def test_missing_admin_token_refuses_to_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDPROMPT_")}
    env["FEDPROMPT_DATA_DIR"] = str(tmp_path)
    done = subprocess.run([*coordinator_cmd(), "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "FEDPROMPT_ADMIN_TOKEN is not set" in done.stderr and "--dev" in done.stderr


def test_dev_generates_a_private_token_once(tmp_path: Path) -> None:
    settings = require_admin_token(Settings(data_dir=tmp_path, admin_token=None), dev=True)
    path = tmp_path / "admin-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert settings.admin_secret() == path.read_text().strip() and len(settings.admin_secret()) >= 32
    again = require_admin_token(Settings(data_dir=tmp_path, admin_token=None), dev=True)
    assert again.admin_secret() == settings.admin_secret()


def test_without_dev_a_missing_token_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FEDPROMPT_ADMIN_TOKEN"):
        require_admin_token(Settings(data_dir=tmp_path, admin_token=None), dev=False)


def test_short_admin_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPROMPT_ADMIN_TOKEN", "short")
    with pytest.raises(ValueError, match="at least 16"):
        Settings()


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FEDPROMPT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FEDPROMPT_MAX_UPLOAD_BYTES", "2048")
    s = Settings()
    assert s.max_upload_bytes == 2048
    assert s.url == f"sqlite:///{(tmp_path / 'fedprompt.db').resolve()}"


# -- issue 34: what serve says about the admin token, and configuration errors in one line ----------


def _serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    """`fedprompt-coordinator serve ARGS` in-process, uvicorn.run replaced by a no-op."""
    import uvicorn
    from fedprompt.coordinator import cli
    from typer.testing import CliRunner

    for key in [k for k in os.environ if k.startswith("FEDPROMPT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FEDPROMPT_DATA_DIR", str(tmp_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    return CliRunner().invoke(cli.app, ["serve", *args, "--log-format", "json"])


def test_dev_with_the_token_in_the_environment_says_so_and_writes_no_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    done = _serve(monkeypatch, tmp_path, {"FEDPROMPT_ADMIN_TOKEN": "x" * 20}, "--dev")
    assert done.exit_code == 0, done.output
    assert "admin token from the environment (FEDPROMPT_ADMIN_TOKEN)" in done.output
    assert "admin token in" not in done.output
    assert not (tmp_path / "admin-token").exists()


def test_dev_that_writes_the_token_file_says_how_to_export_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    done = _serve(monkeypatch, tmp_path, {}, "--dev")
    assert done.exit_code == 0, done.output
    path = tmp_path / "admin-token"
    assert path.exists()
    assert f"admin token written to {path}" in done.output
    assert f"export FEDPROMPT_ADMIN_TOKEN=$(cat {path})" in done.output
    again = _serve(monkeypatch, tmp_path, {}, "--dev")
    assert f"admin token read from {path}" in again.output


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            {"FEDPROMPT_ADMIN_TOKEN": "short"},
            "error: invalid configuration: FEDPROMPT_ADMIN_TOKEN must be at least 16",
        ),
        (
            {"FEDPROMPT_ADMIN_TOKEN": "x" * 20, "FEDPROMPT_PORT": "eighty"},
            "error: invalid configuration: FEDPROMPT_PORT: Input should be a valid integer",
        ),
        (
            {"FEDPROMPT_ADMIN_TOKEN": "x" * 20, "FEDPROMPT_MAX_UPLOAD_BYTES": "12"},
            "FEDPROMPT_MAX_UPLOAD_BYTES: Input should be greater than or equal to 1024 (got '12')",
        ),
    ],
)
def test_a_configuration_error_is_one_line_naming_the_setting_and_its_rule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], line: str
) -> None:
    done = _serve(monkeypatch, tmp_path, env)
    assert done.exit_code == 2
    assert line in done.output
    assert len(done.output.strip().splitlines()) == 1, done.output
    assert "pydantic" not in done.output and "'short'" not in done.output  # a secret is never echoed
