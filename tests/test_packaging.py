"""The distribution: one top-level import (`fedprompt`), every folder of the source tree packaged, and a
wheel that works on its own — built here, installed into a new virtual environment in an empty folder
(no repository beside it, no data sets, no network), then `fedprompt --version`, a one-round
`fedprompt demo` on the SST-2 copy inside the package, and a coordinator's `/healthz`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest
from fedprompt.shared.local import free_port

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


TORCH_PARTS = ("torch", "functorch", "torchgen")


def lend_torch(venv: Path) -> None:
    """torch (the largest dependency: ~750 MB installed) lent from this interpreter's environment,
    alone: symlinks to its folders in a folder a .pth file puts on the new venv's path.
    pip counts it as installed (the constraints pin the same version) and installs the rest itself;
    a .pth line adds a path and nothing else, so none of this environment's other packages (nor its
    editable fedprompt) becomes visible."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    lent = venv / "lent"
    lent.mkdir()
    for entry in site.iterdir():
        if entry.name.split("-")[0] in TORCH_PARTS:
            (lent / entry.name).symlink_to(entry)
    (new_site,) = (venv / "lib").glob("python3*/site-packages")
    (new_site / "lent-torch.pth").write_text(f"{lent}\n")


@pytest.mark.slow
def test_wheel_installs_and_runs_alone(wheel: Path, tmp_path: Path) -> None:
    """A new venv in an empty folder: install the wheel with its `sim` extra (torch lent, the rest
    installed by pip from the wheel's own requirements), then use it."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    lend_torch(venv)
    # --no-compile: the byte code of what is imported is written on first import; compiling all of
    # torch and transformers ahead took longer than the rest of this test
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
    ]
    done = subprocess.run(
        [*pip, "-c", str(ROOT / "constraints.txt"), f"{wheel}[sim]"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

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
