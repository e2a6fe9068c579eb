"""What the three command lines (`fedprompt`, `fedprompt-coordinator`, `fedprompt-worker`) share:
`--version`, `-h` beside `--help`, boolean flags shown as flags, and old option spellings kept as
hidden aliases (rewritten before parsing, so help shows one name per concept)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import typer
from typer.core import TyperGroup, TyperOption

from fedprompt import __version__

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """A boolean flag takes no value: show no `<bool>` after it."""
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


_display_type_rich = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def version_text() -> str:
    return f"fedprompt {__version__}"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


VersionOption = typer.Option(
    False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
)


def rewrite(args: Sequence[str], aliases: Mapping[str, str]) -> list[str]:
    """`args` with every old option spelling (`--url`, `--url=X`) replaced by its current name."""
    out = []
    for arg in args:
        if arg == "--":
            out += list(args[len(out) :])
            break
        name, eq, value = arg.partition("=")
        out.append(aliases[name] + eq + value if name in aliases else arg)
    return out


def aliased_group(aliases: Mapping[str, str], env: Mapping[str, str] | None = None) -> type[TyperGroup]:
    """A root command group that accepts the old spellings in `aliases` (option → current option) and
    reads the old environment variables in `env` (old → current) when the current one is unset."""

    class AliasedGroup(TyperGroup):
        def main(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
            for old, new in (env or {}).items():
                if os.environ.get(old) and not os.environ.get(new):
                    os.environ[new] = os.environ[old]
            given = sys.argv[1:] if args is None else list(args)
            return super().main(rewrite(given, aliases), *rest, **kwargs)

    return AliasedGroup


def make_app(
    help: str, *, aliases: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
) -> typer.Typer:
    """A root Typer app with `--version`, `-h` and the aliases."""
    app = typer.Typer(
        help=help,
        no_args_is_help=True,
        context_settings=CONTEXT_SETTINGS,
        cls=aliased_group(aliases or {}, env),
    )

    @app.callback()
    def _root(version: bool = VersionOption) -> None:
        pass

    return app
