"""Static validation of deploy/: Kubernetes overlays against the API schemas, compose against the
compose specification, Dockerfiles through hadolint; each validator is also shown to reject a
broken file."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.files import (
    COMPOSE_FILES,
    DEPLOY,
    DOCKERFILES,
    OVERLAYS,
    ROOT,
    compose,
    console_scripts,
    dockerfile_stages,
    find,
    pod_spec,
    render,
)
from tests.deploy.kustomize import KustomizeError, build

BIN = Path(sys.executable).parent
# An older Kubernetes release and the newest whose schemas kubernetes-validate ships.
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
# Made by the operator (docs/deployment.md); everything else a manifest refers to must be rendered.
OPERATOR_SECRETS = {"fedprompt-coordinator": {"fedprompt_database_url", "fedprompt_admin_token"}}
OPERATOR_SECRETS["fedprompt-worker"] = {"enrollment-token"}
OPERATOR_CLAIMS = {"fedprompt-datasets"}


# --- Kubernetes -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(overlay: str, version: str) -> None:
    objects = render(overlay)

    assert [o["kind"] for o in objects] == [
        "Namespace",
        "ConfigMap",
        "Service",
        "Service",
        "Deployment",
        "StatefulSet",
        "PodDisruptionBudget",
        "Job",
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any error or unknown field


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_python_rendering_equals_kubectl_kustomize(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the comparison with kustomize itself needs it")
    done = subprocess.run(
        [kubectl, "kustomize", str(OVERLAYS[overlay])], capture_output=True, text=True, timeout=60, check=True
    )
    assert render(overlay) == list(yaml.safe_load_all(done.stdout))


def test_a_broken_manifest_is_rejected_by_the_schema_check(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - deployment.yaml\n")
    (tmp_path / "deployment.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: broken\nspec:\n  replicas: two\n"
        "  selector: {matchLabels: {app: x}}\n  template:\n    metadata: {labels: {app: x}}\n"
        "    spec:\n      containers:\n        - name: x\n          image: x:1\n          imagePullPolcy: Always\n"
    )
    (obj,) = build(tmp_path)

    with pytest.raises(kubernetes_validate.ValidationError, match="'two' is not of type 'integer'"):
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)
    obj["spec"]["replicas"] = 2
    with pytest.raises(kubernetes_validate.ValidationError, match="'imagePullPolcy' was unexpected"):
        kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(
    ("kustomization", "message"),
    [
        ("resources: [cm.yaml]\ncommonLabels: {a: b}\n", "unsupported field"),
        ("resources: [missing.yaml]\n", "does not exist"),
        (
            "resources: [cm.yaml]\npatches:\n  - target: {kind: ConfigMap, name: cm}\n"
            "    patch: '[{op: replace, path: /data/nope, value: x}]'\n",
            "does not exist in ConfigMap",
        ),
        (
            "resources: [cm.yaml]\npatches:\n  - target: {kind: ConfigMap, name: other}\n"
            "    patch: '[{op: remove, path: /data}]'\n",
            "matches no resource",
        ),
        ("resources: [cm.yaml, cm.yaml]\n", "defined twice"),
    ],
)
def test_the_renderer_refuses_what_it_cannot_render_faithfully(
    tmp_path: Path, kustomization: str, message: str
) -> None:
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {a: b}\n")
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    with pytest.raises(KustomizeError, match=message):
        build(tmp_path)


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_spec(obj)["containers"]


def _workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_coordinator_runs_two_probed_replicas_behind_a_service_and_a_budget(overlay: str) -> None:
    objects = render(overlay)
    deployment = find(objects, "Deployment", "fedprompt-coordinator")
    service = find(objects, "Service", "fedprompt-coordinator")
    budget = find(objects, "PodDisruptionBudget", "fedprompt-coordinator")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = _containers(deployment)

    assert deployment["spec"]["replicas"] == 2
    assert container["command"] + container["args"] == ["fedprompt-coordinator", "serve"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"name": "http", "containerPort": 8000} in container["ports"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["spec"]["minAvailable"] == 1
    job = find(objects, "Job", "fedprompt-migrate")
    assert [c["command"] + c["args"] for c in _containers(job)] == [["fedprompt-coordinator", "migrate"]]


def test_the_gpu_overlay_asks_for_one_gpu_per_worker_and_the_cpu_overlay_for_none() -> None:
    gpu, cpu = render("gpu"), render("cpu")
    (gpu_worker,) = _containers(find(gpu, "StatefulSet", "fedprompt-worker"))
    (cpu_worker,) = _containers(find(cpu, "StatefulSet", "fedprompt-worker"))

    assert gpu_worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu_worker["image"].endswith("-cuda")
    assert "--device cuda" in find(gpu, "ConfigMap", "fedprompt")["data"]["FEDPROMPT_WORKER_ARGS"]
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(cpu)
    assert cpu_worker["image"].endswith("-cpu")
    assert "--device cpu" in find(cpu, "ConfigMap", "fedprompt")["data"]["FEDPROMPT_WORKER_ARGS"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_worker_statefulset_derives_its_partition_from_the_pod_ordinal(overlay: str) -> None:
    objects = render(overlay)
    stateful = find(objects, "StatefulSet", "fedprompt-worker")
    (container,) = _containers(stateful)
    env = {e["name"]: e for e in container["env"]}
    config = find(objects, "ConfigMap", "fedprompt")["data"]

    assert container["command"] == ["/bin/sh", "-c"]
    assert container["args"][0].startswith("exec fedprompt-worker serve ")
    assert '--partition-id "${POD_NAME##*-}"' in container["args"][0]
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert int(config["FEDPROMPT_NUM_PARTITIONS"]) == stateful["spec"]["replicas"]
    headless = find(objects, "Service", stateful["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    # The shell's ${POD_NAME##*-} on the names the StatefulSet gives its pods:
    for ordinal in range(stateful["spec"]["replicas"]):
        pod = f"{stateful['metadata']['name']}-{ordinal}"
        out = subprocess.run(
            ["/bin/sh", "-c", 'echo "${POD_NAME##*-}"'], env={"POD_NAME": pod}, capture_output=True, text=True
        )
        assert out.stdout.strip() == str(ordinal)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_reference_resolves_and_no_secret_value_is_in_the_manifests(overlay: str) -> None:
    objects = render(overlay)
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}

    assert not [o for o in objects if o["kind"] == "Secret"]
    for workload in _workloads(objects):
        spec = pod_spec(workload)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                keys = {i["key"] for i in volume["secret"].get("items", [])}
                assert keys <= OPERATOR_SECRETS[volume["secret"]["secretName"]]
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in OPERATOR_CLAIMS
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["key"] in config_maps[ref["configMapKeyRef"]["name"]]
                elif "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in OPERATOR_SECRETS[ref["secretKeyRef"]["name"]]
                elif any(w in env["name"] for w in ("TOKEN", "PASSWORD", "DATABASE_URL")):
                    pytest.fail(f"{workload['metadata']['name']}: {env['name']} has a literal value")


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_pod_runs_as_the_images_non_root_user_with_resource_requests(overlay: str) -> None:
    for workload in _workloads(render(overlay)):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        for container in spec["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert {"cpu", "memory"} <= set(container["resources"]["requests"])
            assert ":" in container["image"] and not container["image"].endswith(":latest")


# --- compose ----------------------------------------------------------------------------------


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_files_are_valid_against_the_compose_specification(path: Path) -> None:
    done = _check_compose(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_compose_file_is_rejected(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  coordinator:\n    imagee: fedprompt-coordinator:0.1.0\n    ports: 8000\n")
    done = _check_compose(broken)
    assert done.returncode == 1
    assert "imagee" in done.stdout


def test_the_compose_stack_runs_the_same_commands_as_the_kubernetes_manifests() -> None:
    services = compose()["services"]
    objects = render("cpu")
    (job,) = _containers(find(objects, "Job", "fedprompt-migrate"))
    (coordinator,) = _containers(find(objects, "Deployment", "fedprompt-coordinator"))
    entrypoint = dockerfile_stages(DOCKERFILES["coordinator"])[-1].exec_form("ENTRYPOINT")

    assert entrypoint + services["migrate"]["command"] == job["command"] + job["args"]
    for name in ("coordinator-a", "coordinator-b"):
        assert entrypoint + services[name]["command"] == coordinator["command"] + coordinator["args"]
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["FEDPROMPT_SECRETS_DIR"] == "/run/secrets"
        assert set(services[name]["secrets"]) == {"fedprompt_database_url", "fedprompt_admin_token"}
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    assert len(workers) == 3
    ids = []
    for service in workers.values():
        command = service["command"]
        assert command[0] == "serve"
        assert command[command.index("--num-partitions") + 1] == str(len(workers))
        ids.append(int(command[command.index("--partition-id") + 1]))
        assert any(v.endswith(":/data:ro") for v in service["volumes"])
    assert sorted(ids) == [0, 1, 2]
    assert {workers[n]["environment"]["FEDPROMPT_COORDINATOR"] for n in workers} == {
        "http://coordinator-a:8000",
        "http://coordinator-b:8000",
    }


def test_make_secrets_writes_the_files_compose_mounts_and_keeps_them(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    subprocess.run(["sh", str(DEPLOY / "make-secrets.sh"), str(folder)], check=True, capture_output=True)
    first = {p.name: p.read_text() for p in folder.iterdir()}
    subprocess.run(["sh", str(DEPLOY / "make-secrets.sh"), str(folder)], check=True, capture_output=True)

    wanted = {Path(s["file"]).name for s in compose()["secrets"].values()}
    assert wanted | {".gitignore"} == set(first)
    assert {p.name: p.read_text() for p in folder.iterdir()} == first  # a second run changes nothing
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    password = first["postgres_password"].strip()
    assert len(password) == 48
    assert first["fedprompt_database_url"].strip() == (
        f"postgresql+psycopg://fedprompt:{password}@postgres:5432/fedprompt"
    )
    assert len(first["fedprompt_admin_token"].strip()) >= 16  # the coordinator's minimum
    assert first[".gitignore"] == "*\n"


# --- Dockerfiles ------------------------------------------------------------------------------


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hadolint"), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_dockerfiles_pass_hadolint(name: str) -> None:
    done = _hadolint(DOCKERFILES[name])
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_rejects_a_careless_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\nADD . /app\n")
    done = _hadolint(bad)
    assert done.returncode == 1
    assert {"DL3007", "DL3008", "DL3020"} <= set(done.stdout.replace(":", " ").split())


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_images_are_multi_stage_non_root_and_health_checked(name: str) -> None:
    stages = dockerfile_stages(DOCKERFILES[name])
    final = stages[-1]

    assert len(stages) >= 2 and any(kw == "COPY" and "--from=build" in arg for kw, arg in final.instructions)
    assert all(s.base == "${PYTHON_IMAGE}" for s in stages)
    assert final.last("USER") == "10001:10001"
    assert "CMD" in (final.last("HEALTHCHECK") or "")
    assert not any(w in k for k in final.env() for w in ("TOKEN", "PASSWORD", "SECRET", "DATABASE_URL"))
    (entrypoint,) = final.exec_form("ENTRYPOINT")
    assert entrypoint == f"fedprompt-{name}" and entrypoint in console_scripts()


def test_the_coordinator_image_installs_no_torch() -> None:
    build_stage = dockerfile_stages(DOCKERFILES["coordinator"])[0]
    installs = [arg for kw, arg in build_stage.instructions if kw == "RUN" and "pip install" in arg]
    assert installs and all("[" not in arg.split("-c constraints.txt")[1].split("&&")[0] for arg in installs)
    assert 'import torch" 2>/dev/null; then' in installs[-1]  # the build fails if torch came along


def test_the_build_context_keeps_what_the_images_copy_and_drops_the_rest() -> None:
    ignored = {
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"
    }
    copied = set()
    for path in DOCKERFILES.values():
        for stage in dockerfile_stages(path):
            for kw, arg in stage.instructions:
                if kw == "COPY" and not arg.startswith("--from"):
                    copied.update(arg.split()[:-1])
    assert copied == {
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "fedprompt",
        "coordinator",
        "shared",
        "migrations",
        "worker",
        "sim",
    }
    assert not copied & ignored
    assert {".venv", ".git", "runs", "tests", "data", "**/secrets", ".env"} <= ignored
