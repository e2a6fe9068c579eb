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

try:  # typer carries its own copy of click
    from typer._click.core import Context
    from typer._click.exceptions import BadParameter
except ImportError:  # pragma: no cover - a typer that uses click itself
    # mypy checks against the pinned typer, which carries its own click: to it, click's classes are others
    from click import BadParameter, Context  # type: ignore[assignment]

from fedprompt import __version__

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """A boolean flag takes no value: show no `<bool>` after it."""
    if self.is_flag and not self.count:
        return None
    return _display_type_rich(self, ctx)


_display_type_rich = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]  # typer has no hook for it


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
    out: list[str] = []
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
            # the current name is set for this invocation only: a caller that runs the command in its
            # own process (a test, an embedding program) keeps its environment as it was
            copied = []
            for old, new in (env or {}).items():
                if os.environ.get(old) and not os.environ.get(new):
                    os.environ[new] = os.environ[old]
                    copied.append(new)
            try:
                given = sys.argv[1:] if args is None else list(args)
                self._args = rewrite(given, aliases)
                return super().main(self._args, *rest, **kwargs)
            finally:
                for name in copied:
                    os.environ.pop(name, None)

        def invoke(self, ctx: Context) -> Any:
            try:
                return super().invoke(ctx)
            except BadParameter as exc:
                line = environment_error(exc, getattr(self, "_args", []))
                if line is None:
                    raise
                typer.echo(f"error: {line}", err=True)
                raise typer.Exit(2) from None

    return AliasedGroup


def environment_error(exc: BadParameter, args: Sequence[str]) -> str | None:
    """One line for a bad value that came from an environment variable (a setting of a service):
    the variable, its value and the rule; None when the value was given on the command line."""
    param = exc.param
    if param is None or not param.envvar or any(opt in args for opt in getattr(param, "opts", ())):
        return None
    names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
    name = next((n for n in names if os.environ.get(n)), None)
    if name is None:
        return None
    option = max(getattr(param, "opts", ()) or [param.name or ""], key=len)
    return f"{name}={os.environ[name]!r} ({option}): {exc.message}"


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
