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
