"""Schema migrations (Alembic) applied programmatically by `fedprompt-coordinator migrate` and `serve`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from fedprompt import migrations


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at the packaged migrations folder."""
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`."""
    command.upgrade(alembic_config(url), revision)


def head_revision() -> str | None:
    """The newest migration's revision id."""
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def schema_is_current(engine: Engine) -> bool:
    """True if the database's schema is at the migrations' head."""
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current == head_revision()
