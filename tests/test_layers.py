"""The layering: shared/ at the bottom; coordinator/ and worker/ side by side on it, never importing
each other; sim/ (simulate, experiment grids, the `fedprompt` operator CLI) above both. Inside the
coordinator, floors from the top down (COORDINATOR_FLOORS): cli; app and hosting/server.py; api;
dashboard; the use cases and service.py, which wires them; persistence/store.py, downloadlog.py and
notify.py, and logic; persistence/db.py (and metrics, which reads it); the leaves that import no
other floor (config, errors, the rest of hosting/ and persistence/). A module imports only from its
own floor or below, and every module of the coordinator stands on a floor.

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
# The coordinator's floors, top first: each names the modules and packages of coordinator/ that stand
# on it, as dotted paths below coordinator/ (a package with everything inside it); a module stands on
# the floor of the longest name that covers it.
COORDINATOR_FLOORS: tuple[tuple[str, frozenset[str]], ...] = (
    ("cli", frozenset({"cli"})),
    ("app", frozenset({"app", "hosting.server"})),
    ("api", frozenset({"api"})),
    ("dashboard", frozenset({"dashboard"})),
    ("usecases", frozenset({"usecases", "service"})),
    ("store", frozenset({"persistence.store", "persistence.downloadlog", "persistence.notify", "logic"})),
    ("db", frozenset({"persistence.db", "metrics"})),
    (
        "leaves",
        frozenset(
            {
                "config",
                "errors",
                "hosting",
                "hosting.inflight",
                "hosting.paths",
                "hosting.ratelimit",
                "persistence",
                "persistence.groupcommit",
                "persistence.migrate",
                "persistence.writelock",
            }
        ),
    ),
)


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
            for alias in node.names:  # `from . import worker`, `from fedprompt.coordinator import api`
                yield node.lineno, f"{name}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def violations(root: Path) -> list[str]:
    """'file:line imports module' for every import that crosses the layering under `root` (one per line)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(("fedprompt", *path.relative_to(root).with_suffix("").parts))
            for line, name in imported_modules(path, module):
                parts = name.split(".")
                if parts[0] == "fedprompt" and len(parts) > 1 and parts[1] in FORBIDDEN[package]:
                    where = f"{path.relative_to(root)}:{line}"
                    found.setdefault(where, f"{where} imports {name}")
    return list(found.values())


def coordinator_floor(name: str) -> int | None:
    """The floor (0 at the top) of a module of the coordinator, None for a name that is none of its
    floors' (outside the coordinator, the package itself, a name imported from a module)."""
    parts = name.split(".")
    if parts[:2] != ["fedprompt", "coordinator"] or len(parts) < 3:
        return None
    for end in range(len(parts), 2, -1):  # the longest dotted name that a floor lists
        below = ".".join(parts[2:end])
        floor = next((i for i, (_, names) in enumerate(COORDINATOR_FLOORS) if below in names), None)
        if floor is not None:
            return floor
    return None


def floor_violations(root: Path) -> list[str]:
    """'file:line imports module (floor below floor)' for every import inside the coordinator that
    reaches a higher floor (one per line), and 'file stands on no floor' for a module that none names."""
    found: dict[str, str] = {}
    for path in sorted((root / "coordinator").rglob("*.py")):
        if path == root / "coordinator" / "__init__.py":
            continue
        module = ".".join(("fedprompt", *path.relative_to(root).with_suffix("").parts))
        floor = coordinator_floor(module)
        if floor is None:
            found[str(path)] = f"{path.relative_to(root)} stands on no floor (COORDINATOR_FLOORS)"
            continue
        for line, name in imported_modules(path, module):
            target = coordinator_floor(name)
            if target is not None and target < floor:
                below, above = COORDINATOR_FLOORS[floor][0], COORDINATOR_FLOORS[target][0]
                where = f"{path.relative_to(root)}:{line}"
                found.setdefault(where, f"{where} imports {name} ({below} below {above})")
    return list(found.values())


def test_coordinator_and_worker_never_import_each_other_and_shared_imports_neither() -> None:
    assert violations(ROOT) == []


def test_the_coordinator_imports_only_from_its_own_floor_or_below() -> None:
    assert floor_violations(ROOT) == []


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
        (
            "worker/engine/x.py",
            "import importlib\nimportlib.import_module('fedprompt.coordinator.persistence.db')\n",
        ),
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


@pytest.mark.parametrize(
    ("file", "source"),
    [
        ("coordinator/logic/x.py", "from fedprompt.coordinator.api import deps\n"),
        ("coordinator/metrics.py", "from fedprompt.coordinator.api.paths import UPLOAD_ROUTE\n"),
        (
            "coordinator/persistence/store.py",
            "def f():\n    from fedprompt.coordinator.usecases import reads\n",
        ),
        ("coordinator/persistence/db.py", "from . import store\n"),
        ("coordinator/usecases/x.py", "from ..dashboard.view import page\n"),
        ("coordinator/dashboard/view.py", "from fedprompt.coordinator import app\n"),
        ("coordinator/api/routes/x.py", "def f():\n    import fedprompt.coordinator.cli\n"),
        (
            "coordinator/errors.py",
            "import importlib\nimportlib.import_module('fedprompt.coordinator.persistence.db')\n",
        ),
        ("coordinator/hosting/server.py", "from fedprompt.coordinator.cli import main\n"),
        ("coordinator/elsewhere.py", "from fedprompt.coordinator import db\n"),
    ],
)
def test_an_import_up_a_floor_or_a_module_on_none_is_found(tmp_path: Path, file: str, source: str) -> None:
    (tmp_path / "coordinator").mkdir()
    (tmp_path / "coordinator" / "__init__.py").write_text("")
    allowed = {
        "coordinator/cli.py": "from fedprompt.coordinator import app, config\nfrom fedprompt.coordinator.hosting import server\n",
        "coordinator/hosting/server.py": "from fedprompt.coordinator.persistence import migrate\n",
        "coordinator/app.py": "from fedprompt.coordinator.api import routes\nfrom fedprompt.coordinator import service\n",
        "coordinator/api/deps.py": "from ..service import Coordinator\nfrom fedprompt.coordinator.metrics import Metrics\n",
        "coordinator/service.py": "from fedprompt.coordinator.usecases.reads import Reads\n",
        "coordinator/usecases/reads.py": "from fedprompt.coordinator.logic import ledger\nfrom . import rounds\n",
        "coordinator/persistence/store.py": "from fedprompt.coordinator.logic.evaluation import due\n",
        "coordinator/logic/uploads.py": "from fedprompt.coordinator.persistence.db import Round\nfrom ..errors import Gone\n",
        "coordinator/metrics.py": "from fedprompt.coordinator.hosting.paths import UPLOAD_ROUTE\n",
        "coordinator/config.py": "from fedprompt.coordinator.hosting.ratelimit import Limits\nfrom fedprompt.shared import spec\n",
    }
    for name, text in {**allowed, file: source}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert len(floor_violations(tmp_path)) == 1, floor_violations(tmp_path)
