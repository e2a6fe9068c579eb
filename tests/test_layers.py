"""The layering: shared/ at the bottom; coordinator/ and worker/ side by side on it, never importing
each other; sim/ (simulate, experiment grids, the `fedprompt` operator CLI) above both.

Every .py file of each package is parsed and each import read, lazy ones inside functions included
(`import x`, `from x import y`, relative imports resolved, `importlib.import_module("x")` and
`__import__("x")` with a literal name).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "coordinator", "worker", "sim")
# What each package must not import (anything else of the four is allowed).
FORBIDDEN: dict[str, frozenset[str]] = {
    "shared": frozenset({"coordinator", "worker", "sim"}),
    "coordinator": frozenset({"worker", "sim"}),
    "worker": frozenset({"coordinator", "sim"}),
    "sim": frozenset(),
}


def imported_modules(path: Path, module: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file of `module` (e.g. 'fedprompt.coordinator.api.deps')."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name
            for alias in node.names:  # `from . import worker` at the top of a package
                if node.level and not node.module:
                    yield node.lineno, f"{name}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def violations(root: Path) -> list[str]:
    """'file:line imports module' for every import that crosses the layering under `root`."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(("fedprompt", *path.relative_to(root).with_suffix("").parts))
            for line, name in imported_modules(path, module):
                parts = name.split(".")
                if parts[0] == "fedprompt" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def test_coordinator_and_worker_never_import_each_other_and_shared_imports_neither() -> None:
    assert violations(ROOT) == []


def test_every_package_is_read() -> None:
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").is_file(), package


@pytest.mark.parametrize(
    ("file", "source"),
    [
        ("coordinator/service.py", "from fedprompt.worker.engine import PromptEngine\n"),
        ("coordinator/api/routes.py", "def f():\n    import fedprompt.worker.cli\n"),
        ("coordinator/logic/x.py", "from fedprompt.sim import simulate\n"),
        ("worker/agent.py", "def f():\n    from fedprompt.coordinator.logic.ledger import ledger\n"),
        ("worker/engine/x.py", "import importlib\nimportlib.import_module('fedprompt.coordinator.db')\n"),
        ("shared/wire.py", "from fedprompt.worker import poison\n"),
        ("shared/spec.py", "from fedprompt.sim.options import build_spec\n"),
    ],
)
def test_a_crossing_import_is_found(tmp_path: Path, file: str, source: str) -> None:
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / file).write_text(source)
    allowed = "from fedprompt.coordinator import db\nfrom fedprompt.worker import cli\nfrom fedprompt.shared import wire\n"
    (tmp_path / "sim" / "cli.py").write_text(allowed)  # sim stands on all three
    assert len(violations(tmp_path)) == 1, violations(tmp_path)
