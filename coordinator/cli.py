"""fedprompt-coordinator: serve the API, apply migrations."""

from __future__ import annotations

from typing import Annotated

import typer
from fedprompt.coordinator.config import (
    ConfigError,
    Settings,
    dev_token_line,
    load_settings,
    require_admin_token,
)
from fedprompt.shared.logs import LogFormatOption

from fedprompt.clikit import make_app

app = make_app("fedprompt coordinator: federated rounds over HTTP.")


def _settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:  # one line: which variable is wrong, and its rule
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def migrate() -> None:
    """Apply database migrations (FEDPROMPT_DATABASE_URL) up to the newest schema."""
    from fedprompt.coordinator.persistence.migrate import upgrade

    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.url)
    typer.echo(f"database at head: {_redact(settings.url)}")


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Bind address (default FEDPROMPT_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default FEDPROMPT_PORT or 8000).")] = None,
    dev: Annotated[
        bool,
        typer.Option(
            "--dev",
            help="Development: without FEDPROMPT_ADMIN_TOKEN, generate an admin token into "
            "<data_dir>/admin-token (then export FEDPROMPT_ADMIN_TOKEN=$(cat data/admin-token)).",
        ),
    ] = False,
    log_level: Annotated[
        str, typer.Option(help="Level of uvicorn's and the access log (the service logs at info).")
    ] = "info",
    log_format: LogFormatOption = "auto",
) -> None:
    """Migrate the database, then serve the API."""
    import logging

    import uvicorn
    from fedprompt.coordinator.app import create_app
    from fedprompt.coordinator.hosting.server import uvicorn_options
    from fedprompt.coordinator.persistence.migrate import upgrade
    from fedprompt.shared.logs import configure_logging

    try:
        configure_logging("info", log_format)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    access_level = logging.getLevelName(log_level.upper())  # uvicorn's "trace" is not a stdlib level
    logging.getLogger("fedprompt.access").setLevel(access_level if isinstance(access_level, int) else 5)

    before = _settings()
    token_file_existed = (before.data_dir / "admin-token").exists()
    try:
        settings = require_admin_token(before, dev=dev)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if dev:
        typer.echo(dev_token_line(before, token_file_existed), err=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.url)
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=settings.port if port is None else port,
        log_level=log_level,
        log_config=None,  # keep the structlog handler; uvicorn's loggers propagate to it
        access_log=False,  # RequestContextMiddleware writes one access line per request instead
        **uvicorn_options(settings),  # timeouts, head size, connections, trusted proxies
    )


def _redact(url: str) -> str:
    """A URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def main() -> None:
    """Console entry point."""
    app()
