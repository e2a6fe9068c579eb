"""fedprompt-worker: the worker service and centralised training."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="fedprompt worker: trains a soft prompt locally against a frozen PLM.", no_args_is_help=True
)


def _register() -> None:
    from worker.train_local import train_local_command

    app.command("train-local", help="Centralised prompt tuning on a whole data set (the baseline).")(
        train_local_command
    )


def main() -> None:
    """Console entry point."""
    _register()
    app()
