"""Reading deploy/: rendered Kubernetes objects, Dockerfile instructions, the compose file."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.kustomize import build

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = {name: K8S / "overlays" / name for name in ("gpu", "cpu")}
DOCKERFILES = {"coordinator": DEPLOY / "coordinator.Dockerfile", "worker": DEPLOY / "worker.Dockerfile"}
COMPOSE_FILES = [DEPLOY / "compose.yaml", DEPLOY / "compose.gpu.yaml"]


def render(overlay: str | Path) -> list[dict[str, Any]]:
    """`kustomize build` of an overlay name (gpu, cpu) or folder."""
    return build(OVERLAYS.get(str(overlay), overlay))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a Deployment, StatefulSet or Job."""
    return obj["spec"]["template"]["spec"]


def compose() -> dict[str, Any]:
    """deploy/compose.yaml with its YAML anchors and merge keys resolved."""
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def console_scripts() -> dict[str, str]:
    """[project.scripts] of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@dataclass
class Stage:
    """One FROM ... stage of a Dockerfile: its instructions as (KEYWORD, argument text)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]]

    def last(self, keyword: str) -> str | None:
        """The argument of the stage's last `keyword` instruction."""
        found = [arg for kw, arg in self.instructions if kw == keyword]
        return found[-1] if found else None

    def exec_form(self, keyword: str) -> list[str] | None:
        """ENTRYPOINT / CMD in JSON (exec) form as a list."""
        arg = self.last(keyword)
        return None if arg is None else json.loads(arg)

    def env(self) -> dict[str, str]:
        """Every ENV KEY=VALUE of the stage (later wins)."""
        out: dict[str, str] = {}
        for kw, arg in self.instructions:
            if kw == "ENV":
                for item in shlex.split(arg):
                    key, _, value = item.partition("=")
                    out[key] = value
        return out


def dockerfile_stages(path: Path) -> list[Stage]:
    """A Dockerfile's stages (line continuations joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    stages: list[Stage] = []
    for line in lines:
        keyword, _, arg = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = arg.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, []))
        elif stages:
            stages[-1].instructions.append((keyword, arg.strip()))
    return stages
