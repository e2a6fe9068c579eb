"""Secrets as files: the coordinator reads FEDPROMPT_* settings from $FEDPROMPT_SECRETS_DIR (compose / k8s)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fedprompt.coordinator.config import ConfigError, Settings

from tests.helpers import coordinator_cmd

TOKEN = "token-from-a-secret-file-0123456789"


def test_settings_come_from_secret_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fedprompt_admin_token").write_text(TOKEN + "\n")  # editors and `echo` add the newline
    (tmp_path / "fedprompt_database_url").write_text("postgresql+psycopg://fed:pw@db:5432/fedprompt")
    monkeypatch.delenv("FEDPROMPT_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("FEDPROMPT_DATABASE_URL", raising=False)
    monkeypatch.setenv("FEDPROMPT_SECRETS_DIR", str(tmp_path))

    settings = Settings()

    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == TOKEN
    assert settings.url == "postgresql+psycopg://fed:pw@db:5432/fedprompt"


def test_a_variable_wins_over_a_secret_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fedprompt_admin_token").write_text(TOKEN)
    monkeypatch.setenv("FEDPROMPT_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv("FEDPROMPT_ADMIN_TOKEN", "from-the-environment-0123456789")

    assert Settings().admin_secret() == "from-the-environment-0123456789"


def test_without_the_variable_no_folder_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fedprompt_admin_token").write_text(TOKEN)
    monkeypatch.delenv("FEDPROMPT_SECRETS_DIR", raising=False)
    monkeypatch.delenv("FEDPROMPT_ADMIN_TOKEN", raising=False)

    assert Settings().admin_token is None


def test_a_missing_secrets_folder_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDPROMPT_SECRETS_DIR", str(tmp_path / "not-mounted"))
    with pytest.raises(ConfigError, match="not-mounted is not a folder"):
        Settings()


def test_migrate_reads_the_database_url_from_a_secret_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    db = tmp_path / "from-secret.db"
    (secrets / "fedprompt_database_url").write_text(f"sqlite:///{db}\n")
    env = {
        "PATH": "/usr/bin:/bin",
        "FEDPROMPT_SECRETS_DIR": str(secrets),
        "FEDPROMPT_DATA_DIR": str(tmp_path),
    }

    done = subprocess.run(
        [*coordinator_cmd(), "migrate"], env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert db.exists() and str(db) in done.stdout
