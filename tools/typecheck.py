"""mypy over the layout the wheel installs, with pyproject.toml's [tool.mypy].

mypy finds a module by walking folders, and `fedprompt.shared` is not a folder of the repository:
[tool.setuptools.package-dir] maps each `fedprompt.<part>` onto a top-level folder, which the editable
install serves through an import hook that mypy does not run (and mypy_path cannot rename a folder). So
this lays that layout out in .typecheck/ (git-ignored): a `fedprompt/` holding links to the files of
fedprompt/ and one link per mapped part, with links to bench/ (its own top-level package) and tests/
(bench imports `tests.helpers`) beside it. The links are laid anew on each run, so a new module or
part needs nothing here; mypy's cache stays in .typecheck/.mypy_cache.

    python tools/typecheck.py                 # -p fedprompt -p bench
    python tools/typecheck.py -p fedprompt.sim

Paths in the report are the repository's (shared/spec.py, not fedprompt/shared/spec.py). The exit status
is mypy's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".typecheck"
CACHE = ".mypy_cache"
DEFAULT_TARGETS = ["-p", "fedprompt", "-p", "bench"]
# Top-level packages of the repository that are not part of the distribution but are imported by it.
BESIDE = ("bench", "tests")


def package_dirs() -> dict[str, str]:
    """The `fedprompt.<part>` -> folder map of [tool.setuptools.package-dir], the root package left out."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = pyproject["tool"]["setuptools"]["package-dir"]
    return {name: folder for name, folder in mapping.items() if "." in name}


def link(target: Path, at: Path) -> None:
    """A relative link, so that the tree keeps working when the clone moves."""
    at.symlink_to(os.path.relpath(target, at.parent), target_is_directory=target.is_dir())


def lay_out(parts: dict[str, str]) -> dict[str, str]:
    """Builds the tree; returns each of its path prefixes with the repository's prefix it stands for."""
    TREE.mkdir(exist_ok=True)
    for entry in TREE.iterdir():
        if entry.name == CACHE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    package = TREE / "fedprompt"
    package.mkdir()
    for source in sorted((ROOT / "fedprompt").iterdir()):
        if source.suffix in (".py", ".pyi") or source.name == "py.typed":
            link(source, package / source.name)
    prefixes = {}
    for name, folder in parts.items():
        at = TREE.joinpath(*name.split("."))
        link(ROOT / folder, at)
        prefixes[at.relative_to(TREE).as_posix() + "/"] = folder.rstrip("/") + "/"
    for name in BESIDE:
        link(ROOT / name, TREE / name)
    return prefixes


def main(argv: list[str]) -> int:
    prefixes = lay_out(package_dirs())
    targets = argv or DEFAULT_TARGETS
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *targets]
    done = subprocess.run(command, cwd=TREE, stdout=subprocess.PIPE, text=True)
    # Longest prefix first: fedprompt/shared/ before fedprompt/.
    pattern = re.compile("^(" + "|".join(re.escape(p) for p in sorted(prefixes, key=len, reverse=True)) + ")")
    for line in done.stdout.splitlines():
        print(pattern.sub(lambda m: prefixes[m.group(1)], line))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
