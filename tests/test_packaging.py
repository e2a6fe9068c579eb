"""The distribution: one top-level import (`fedprompt`), every folder of the source tree packaged, and a
wheel that works on its own — built here, installed into a new virtual environment in an empty folder
(no repository beside it, no data sets, no network), then `fedprompt --version`, a one-round
`fedprompt demo` on the SST-2 copy inside the package, and a coordinator's `/healthz`.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from fedprompt.shared.local import free_port
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("coordinator", "worker", "shared", "sim", "migrations")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def source_packages() -> list[str]:
    """Every folder of the five parts that holds a file, as the package name it installs under."""
    found = ["fedprompt"]
    for part in PARTS:
        for folder in sorted([ROOT / part, *(ROOT / part).rglob("*")]):
            if not folder.is_dir() or "__pycache__" in folder.parts:
                continue
            if not any(p.is_file() and git_tracked(p) for p in folder.iterdir()):
                continue
            found.append("fedprompt." + ".".join(folder.relative_to(ROOT).parts))
    return found


def git_tracked(path: Path) -> bool:
    done = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
    )
    return done.returncode == 0


def test_every_source_folder_is_a_listed_package() -> None:
    listed = _pyproject()["tool"]["setuptools"]["packages"]
    expected = source_packages()
    assert sorted(listed) == sorted(expected), "pyproject.toml's packages should be:\n" + "\n".join(
        f'  "{p}",' for p in expected
    )


def test_package_dirs_map_only_under_fedprompt() -> None:
    dirs = _pyproject()["tool"]["setuptools"]["package-dir"]
    assert dirs == {"fedprompt": "fedprompt", **{f"fedprompt.{p}": p for p in PARTS}}
    assert isinstance(_pyproject()["project"]["license"], str)  # an SPDX expression, not a table


def source_copy(where: Path) -> Path:
    """The files of the checkout (tracked, and new ones git does not ignore) copied to `where`: the wheel
    is built from them alone, never from a build/ folder an earlier build left in the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, where / name)
    return where


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    tree = source_copy(tmp_path_factory.mktemp("source"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(tree),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the build is quiet: no setuptools deprecation banner, no folder missing from `packages`
    assert "Deprecat" not in done.stderr and "absent from" not in done.stderr, done.stderr
    (built,) = out.glob("fedprompt-*.whl")
    return built


def test_wheel_has_one_top_level_import_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fedprompt", wheel.name.split("-py3")[0] + ".dist-info"}
    top_level = zipfile.ZipFile(wheel).read(wheel.name.split("-py3")[0] + ".dist-info/top_level.txt")
    assert top_level.decode().split() == ["fedprompt"]
    for needed in (
        "fedprompt/migrations/versions/0001_initial_schema.py",
        "fedprompt/migrations/script.py.mako",
        "fedprompt/coordinator/dashboard/templates/dashboard.html",
        "fedprompt/coordinator/dashboard/static/vendor/uplot/uPlot.iife.min.js",
        "fedprompt/worker/engine/configs/all-MiniLM-L6-v2/config.json",
    ):
        assert needed in names, needed
    assert any(n.startswith("fedprompt/") and n.endswith("sst2/test.jsonl.gz") for n in names)


def requirement_closure(wheel: Path, extras: set[str]) -> list[metadata.Distribution]:
    """The distributions of this environment that the wheel's own requirements (with `extras`) need,
    followed through their requirements: what `pip install wheel[extras]` would install, read from the
    wheel's METADATA, so a package the wheel does not declare stays out of the new environment."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        own = email.message_from_bytes(archive.read(meta))
    project = canonicalize_name(own["Name"])
    requires = own.get_all("Requires-Dist") or []
    todo = [(Requirement(r), {"", *extras}) for r in requires]
    found: dict[str, metadata.Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in active):
            continue
        name = canonicalize_name(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name == project:  # `sim` asks for fedprompt[worker]: the wheel's own requirements again
            todo += [(Requirement(r), set(req.extras)) for r in requires]
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"the wheel requires {req}, which this environment lacks: run `make install`")
        assert req.specifier.contains(dist.version, prereleases=True), f"{req}: {dist.version} here"
        found[name] = dist
        todo += [(Requirement(r), {"", *req.extras}) for r in dist.requires or []]
    return list(found.values())


def lend_requirements(venv: Path, dists: list[metadata.Distribution]) -> None:
    """The wheel's requirements lent from this interpreter's environment: symlinks to each
    distribution's top-level entries (its packages, modules and .dist-info folder) in a folder a .pth
    file puts on the new venv's path. pip counts them as installed, so installing the wheel installs
    the wheel alone and checks its requirements against them; a .pth line adds a path and nothing
    else, so none of this environment's other packages (nor its editable fedprompt) becomes visible."""
    lent = venv / "lent"
    lent.mkdir()
    for dist in dists:
        site = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (site / top).exists() and not (lent / top).exists() and not top.endswith(".pth"):
                (lent / top).symlink_to(site / top)
    (new_site,) = (venv / "lib").glob("python3*/site-packages")
    (new_site / "lent.pth").write_text(f"{lent}\n")


@pytest.mark.slow
def test_wheel_installs_and_runs_alone(wheel: Path, tmp_path: Path) -> None:
    """A new venv in an empty folder: the wheel installed with its `sim` extra, its requirements lent
    (installing them from the index took most of this test's time; `pip` still resolves the wheel's
    requirements and the constraints against them, with no index to fall back on), then used."""
    venv = tmp_path / "venv"
    # no pip and no setuptools of its own: this interpreter's pip installs into it (`--python`), and
    # nothing in it shadows what is lent
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    lend_requirements(venv, requirement_closure(wheel, {"sim"}))
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(venv / "bin" / "python"),
        "--disable-pip-version-check",
    ]
    # --no-index: every requirement must be met by what is lent (pip resolves the wheel's requirements
    # and the constraints against it); --no-compile: byte code is written on first import
    done = subprocess.run(
        [
            *pip,
            "install",
            "--quiet",
            "--no-compile",
            "--no-index",
            "-c",
            str(ROOT / "constraints.txt"),
            f"{wheel}[sim]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr

    home = tmp_path / "home"
    work = tmp_path / "elsewhere"
    home.mkdir()
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FEDPROMPT_DATASETS", "PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PYTEST")
    } | {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "xdg"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
    }

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / args[0]), *args[1:]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    where = run(
        "python",
        "-c",
        "import fedprompt.coordinator as c, fedprompt; print(c.__file__, fedprompt.__version__)",
    )
    assert where.returncode == 0, where.stderr
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout, where.stdout
    for name in ("coordinator", "worker", "shared", "sim", "migrations"):  # no stray top-level modules
        stray = run("python", "-c", f"import {name}")
        assert stray.returncode != 0, f"the wheel installed a top-level {name!r}"

    version = run("fedprompt", "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"fedprompt {wheel.name.split('-')[1]}"

    demo = run(
        "fedprompt",
        "demo",
        "--rounds",
        "1",
        "--local-steps",
        "2",
        "--train-limit",
        "64",
        "--eval-limit",
        "64",
        "--out",
        str(work / "demo"),
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    results = json.loads((work / "demo" / "results.json").read_text())
    assert results["rounds"][-1]["round"] == 1
    assert 0.0 <= results["final_accuracy"] <= 1.0

    port = free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "fedprompt-coordinator"), "serve", "--port", str(port)],
        cwd=work,
        env=env
        | {
            "FEDPROMPT_ADMIN_TOKEN": "a-long-enough-admin-token-for-the-wheel-test",
            "FEDPROMPT_DATABASE_URL": f"sqlite:///{work / 'coordinator.db'}",
            "FEDPROMPT_DATA_DIR": str(work / "data"),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 60, "the installed coordinator's /healthz")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
