"""checkov on what deploy/ ships: both rendered overlays, the example Postgres and both Dockerfiles pass
with 0 failed checks, and every check skipped is waived in the file itself, with its reason, and listed
here (WAIVED). checkov is also shown to fail a careless manifest and Dockerfile.

checkov's own pins clash with the project's, so it never enters .venv: it runs from a virtual
environment of its own, CHECKOV_VERSION with the versions of checkov-constraints.txt, installed from
PyPI once into the user's cache folder ($XDG_CACHE_HOME or ~/.cache, fedprompt-tests/checkov-*; about
a minute) and re-used by later runs and other clones, as pre-commit keeps its tools, or from
FEDPROMPT_CHECKOV naming a checkov executable. Where it cannot be installed (no network)
the tests are skipped with pip's message. checkov has no framework for compose files; test_manifests.py
checks those.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.files import DOCKERFILES, K8S, OVERLAYS
from tests.deploy.kustomize import build

CHECKOV_VERSION = "3.3.30"
CONSTRAINTS = Path(__file__).with_name("checkov-constraints.txt")
RENDERED = {**{name: path for name, path in OVERLAYS.items()}, "postgres": K8S / "examples" / "postgres"}
_DIGEST = "The image is built by the operator from deploy/{}.Dockerfile, so no digest can be known here"
# (rendered file or Dockerfile, check, resource) -> the start of the reason given in the manifest.
WAIVED = {
    **{
        (overlay, "CKV_K8S_43", f"{kind}.fedprompt.{name}"): _DIGEST.format(image)
        for overlay in OVERLAYS
        for kind, name, image in [
            ("Deployment", "fedprompt-coordinator", "coordinator"),
            ("Job", "fedprompt-migrate", "coordinator"),
            ("StatefulSet", "fedprompt-worker", "worker"),
        ]
    },
    ("postgres", "CKV_K8S_43", "StatefulSet.fedprompt.fedprompt-postgres"): "An example pinned by exact tag",
    **{
        (
            f"{name}.Dockerfile",
            "CKV_DOCKER_7",
            f"{name}.Dockerfile",
        ): "the base image is the ARG PYTHON_IMAGE"
        for name in DOCKERFILES
    },
}


@pytest.fixture(scope="session")
def checkov() -> Path:
    """The checkov executable: $FEDPROMPT_CHECKOV, or the pinned one in its own cached venv."""
    if os.environ.get("FEDPROMPT_CHECKOV"):
        return Path(os.environ["FEDPROMPT_CHECKOV"])
    pins = hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = (
        cache
        / "fedprompt-tests"
        / f"checkov-{CHECKOV_VERSION}-{pins}-py{sys.version_info[0]}{sys.version_info[1]}"
    )
    home.mkdir(parents=True, exist_ok=True)
    venv, done = home / "venv", home / "installed"
    with open(home / "lock", "w") as lock:  # concurrent sessions install once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)  # a half-made one
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            pip = subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    f"checkov=={CHECKOV_VERSION}",
                    "-c",
                    str(CONSTRAINTS),
                ],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if pip.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                lines = (pip.stderr or pip.stdout).strip().splitlines() or ["(no output)"]
                pytest.skip(f"checkov {CHECKOV_VERSION} could not be installed: {lines[-1]}")
            done.write_text(CHECKOV_VERSION + "\n")
    return venv / "bin" / "checkov"


def _run(checkov: Path, files: list[Path], cwd: Path) -> list[dict[str, Any]]:
    """checkov's JSON reports (one per framework) on these files."""
    done = subprocess.run(
        [str(checkov), "--framework", "kubernetes", "dockerfile", "--skip-download", "-o", "json"]
        + [arg for f in files for arg in ("-f", str(f))],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    reports = json.loads(done.stdout)
    return reports if isinstance(reports, list) else [reports]


def _by_framework(reports: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["check_type"]: r for r in reports}


def _checks(report: dict[str, Any], outcome: str) -> list[dict[str, Any]]:
    return report["results"][f"{outcome}_checks"]


def test_checkov_passes_the_manifests_and_dockerfiles_with_each_waiver_reasoned(
    checkov: Path, tmp_path: Path
) -> None:
    files, workloads = [], set()
    for name, folder in RENDERED.items():
        objects = build(folder)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False, width=1000))
        files.append(tmp_path / f"{name}.yaml")
        workloads |= {
            (name, f"{o['kind']}.fedprompt.{o['metadata']['name']}")
            for o in objects
            if o["kind"] in ("Deployment", "StatefulSet", "Job")
        }
    for path in DOCKERFILES.values():
        shutil.copy(path, tmp_path / path.name)
        files.append(tmp_path / path.name)

    reports = _by_framework(_run(checkov, files, tmp_path))

    assert set(reports) == {"kubernetes", "dockerfile"}
    for report in reports.values():
        assert report["summary"]["checkov_version"] == CHECKOV_VERSION
        assert report["summary"]["parsing_errors"] == 0
        failed = [(c["check_id"], c["resource"], c["file_path"]) for c in _checks(report, "failed")]
        assert failed == [], f"{report['check_type']}: {failed}"
    # Every workload of every rendered file was checked, and each Dockerfile.
    seen = {(Path(c["file_path"]).stem, c["resource"]) for c in _checks(reports["kubernetes"], "passed")}
    assert workloads <= seen
    assert {Path(c["file_path"]).name for c in _checks(reports["dockerfile"], "passed")} == {
        p.name for p in DOCKERFILES.values()
    }
    assert reports["kubernetes"]["summary"]["passed"] >= 600  # 265 per overlay, 89 for Postgres
    # Skipped: exactly the waivers listed above, each with its reason from the file.
    skipped = {}
    for report in reports.values():
        for c in _checks(report, "skipped"):
            where = Path(c["file_path"]).name
            where = where if where.endswith(".Dockerfile") else Path(where).stem
            resource = c["resource"].rsplit("/", 1)[-1].removesuffix(".")
            skipped[(where, c["check_id"], resource)] = c["check_result"]["suppress_comment"]
    assert set(skipped) == set(WAIVED)
    for key, reason in skipped.items():
        assert reason.startswith(WAIVED[key]), (key, reason)


def test_checkov_fails_a_careless_manifest_and_dockerfile(checkov: Path, tmp_path: Path) -> None:
    (tmp_path / "careless.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: careless, namespace: x}\nspec:\n"
        "  selector: {matchLabels: {app: careless}}\n  template:\n    metadata: {labels: {app: careless}}\n"
        "    spec:\n      containers:\n        - name: c\n          image: example/careless:1.0\n"
        "          env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: s, key: token}}}]\n"
    )
    (tmp_path / "careless.Dockerfile").write_text('FROM python:latest\nCOPY . /app\nCMD ["python"]\n')

    reports = _by_framework(
        _run(checkov, [tmp_path / "careless.yaml", tmp_path / "careless.Dockerfile"], tmp_path)
    )

    k8s = {c["check_id"] for c in _checks(reports["kubernetes"], "failed")}
    docker = {c["check_id"] for c in _checks(reports["dockerfile"], "failed")}
    assert {"CKV_K8S_11", "CKV_K8S_22", "CKV_K8S_35", "CKV_K8S_38", "CKV2_K8S_6"} <= k8s
    assert {"CKV_DOCKER_2", "CKV_DOCKER_3", "CKV_DOCKER_7"} <= docker  # no HEALTHCHECK, no USER, :latest
