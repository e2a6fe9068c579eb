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
from fedprompt.worker.reach import DEFAULT_GIVE_UP_AFTER

from tests.deploy.files import (
    COMPOSE_FILES,
    DEPLOY,
    DOCKERFILES,
    K8S,
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
OPERATOR_SECRETS["fedprompt-worker"] = {"enrollment-token", "worker-token"}
OPERATOR_SECRETS["fedprompt-postgres"] = {"password"}
OPERATOR_CLAIMS = {"fedprompt-datasets"}
POSTGRES_EXAMPLE = K8S / "examples" / "postgres"
# What each rendering holds, in kustomize's order.
APP_KINDS = [
    "Namespace",
    "ConfigMap",
    "Service",
    "Service",
    "Deployment",
    "StatefulSet",
    "PodDisruptionBudget",
    "Job",
]
KINDS = {
    **{overlay: [*APP_KINDS, *["NetworkPolicy"] * 4] for overlay in OVERLAYS},
    "postgres": ["Service", "StatefulSet", "NetworkPolicy"],
}


def _render_any(name: str) -> list[dict[str, Any]]:
    """An overlay, or the example Postgres."""
    return build(POSTGRES_EXAMPLE) if name == "postgres" else render(name)


# --- Kubernetes -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", sorted(KINDS))
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(overlay: str, version: str) -> None:
    objects = _render_any(overlay)

    assert [o["kind"] for o in objects] == KINDS[overlay]
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)  # raises on any error or unknown field


@pytest.mark.parametrize("overlay", sorted(KINDS))
def test_the_python_rendering_equals_kubectl_kustomize(overlay: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the comparison with kustomize itself needs it")
    folder = POSTGRES_EXAMPLE if overlay == "postgres" else OVERLAYS[overlay]
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=True
    )
    assert _render_any(overlay) == list(yaml.safe_load_all(done.stdout))


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


def _secret_files(spec: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """The paths of the files the container's Secret volumes hold."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return {
        f"{m['mountPath']}/{item['path']}"
        for m in container.get("volumeMounts", [])
        if "secret" in volumes.get(m["name"], {})
        for item in volumes[m["name"]]["secret"].get("items", [])
    }


@pytest.mark.parametrize("overlay", sorted(KINDS))
def test_every_reference_resolves_and_no_secret_is_in_the_manifests_or_the_environment(overlay: str) -> None:
    objects = _render_any(overlay)
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
                elif "secretKeyRef" in ref:  # secrets are mounted as files, never put in the environment
                    pytest.fail(f"{workload['metadata']['name']}: {env['name']} comes from a Secret")
                elif any(w in env["name"] for w in ("TOKEN", "PASSWORD", "DATABASE_URL")):
                    # only the path of a file of a mounted Secret
                    assert env["name"].endswith("_FILE"), f"{workload['metadata']['name']}: {env['name']}"
                    assert env["value"] in _secret_files(spec, container), env


_UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _quantity(value: str | int) -> float:
    """A Kubernetes quantity (250m, 2, 512Mi, 1Gi) as a number."""
    text = str(value)
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@pytest.mark.parametrize("overlay", sorted(KINDS))
def test_every_pod_is_non_root_read_only_without_api_token_and_within_cpu_and_memory_limits(
    overlay: str,
) -> None:
    for workload in _workloads(_render_any(overlay)):
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False  # none of them calls the Kubernetes API
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        if overlay != "postgres":
            assert spec["securityContext"]["runAsUser"] == 10001  # the images' user
        assert spec["securityContext"]["runAsUser"] >= 10000
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"])
            for kind in ("cpu", "memory"):
                assert _quantity(resources["requests"][kind]) <= _quantity(resources["limits"][kind])
            assert ":" in container["image"] and not container["image"].endswith(":latest")
            assert container["imagePullPolicy"] == "Always"


def _writable(container: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_worker_writes_only_to_its_volumes(overlay: str) -> None:
    (worker,) = _containers(find(render(overlay), "StatefulSet", "fedprompt-worker"))
    env = {e["name"]: e.get("value") for e in worker["env"]}
    writable = _writable(worker)

    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    # state (credentials, unacknowledged updates), caches (Hugging Face, torch, converted models), tempfile
    for path in (env["FEDPROMPT_STATE_DIR"], env["XDG_CACHE_HOME"], env["HF_HOME"], "/tmp"):
        assert any(path == m or path.startswith(m + "/") for m in writable), path
    volumes = {
        v["name"]: v for v in pod_spec(find(render(overlay), "StatefulSet", "fedprompt-worker"))["volumes"]
    }
    for mount in worker["volumeMounts"]:
        if mount["mountPath"] in ("/tmp", env["XDG_CACHE_HOME"]):
            assert "sizeLimit" in volumes[mount["name"]]["emptyDir"]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_worker_reads_its_tokens_from_files_of_its_secret(overlay: str) -> None:
    stateful = find(render(overlay), "StatefulSet", "fedprompt-worker")
    (worker,) = _containers(stateful)
    env = {e["name"]: e for e in worker["env"]}
    (secret,) = [v for v in pod_spec(stateful)["volumes"] if "secret" in v]
    (mount,) = [m for m in worker["volumeMounts"] if m["name"] == secret["name"]]

    assert mount["readOnly"] is True
    assert secret["secret"]["secretName"] == "fedprompt-worker"
    files = {f"{mount['mountPath']}/{i['path']}": i["key"] for i in secret["secret"]["items"]}
    assert {
        env[name]["value"]: key
        for name, key in [
            ("FEDPROMPT_ENROLLMENT_TOKEN_FILE", "enrollment-token"),
            ("FEDPROMPT_WORKER_TOKEN_FILE", "worker-token"),
        ]
    } == files
    assert not {"FEDPROMPT_ENROLLMENT_TOKEN", "FEDPROMPT_WORKER_TOKEN"} & set(env)
    assert env["FEDPROMPT_WORKER_HOST"]["value"] == "0.0.0.0"  # why the worker token is needed


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_worker_has_a_startup_probe_longer_than_its_wait_for_the_coordinator(overlay: str) -> None:
    (worker,) = _containers(find(render(overlay), "StatefulSet", "fedprompt-worker"))
    startup, liveness = worker["startupProbe"], worker["livenessProbe"]

    for probe in (startup, liveness, worker["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "http"}
    # The worker listens only after loading its shard and model and reaching the coordinator
    # (which it waits for up to --give-up-after): the startup probe allows for that ...
    assert startup["periodSeconds"] * startup["failureThreshold"] >= DEFAULT_GIVE_UP_AFTER + 60
    # ... so liveness, which only starts after it, restarts a hung worker within a minute.
    assert "initialDelaySeconds" not in liveness
    assert liveness["periodSeconds"] * liveness["failureThreshold"] <= 60


# --- network policies -------------------------------------------------------------------------

NAMESPACE = "fedprompt"
DNS = ("kube-system", {"k8s-app": "kube-dns"})
INGRESS_CONTROLLER = ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
OUTSIDE = (None, {})  # an address outside the cluster: a managed database, the internet


def _pod(name: str) -> tuple[str, dict[str, str]]:
    return NAMESPACE, {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "fedprompt"}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # all the policies use
    return selector.get("matchLabels", {}).items() <= labels.items()


def _peer_is(peer: dict[str, Any], policy_ns: str, who: tuple[str | None, dict[str, str]]) -> bool:
    namespace, labels = who
    assert set(peer) <= {"podSelector", "namespaceSelector"}, peer
    if namespace is None:
        return False
    if "namespaceSelector" in peer:
        in_namespace = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    else:
        in_namespace = namespace == policy_ns
    return in_namespace and _selects(peer.get("podSelector", {}), labels)


def _side_allows(policies, direction, local, remote, port, protocol) -> bool:  # noqa: ANN001
    """Whether the policies selecting `local` admit this connection in `direction` (Ingress, Egress)."""
    peers_key = "from" if direction == "Ingress" else "to"
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == local[0]
        and _selects(p["spec"]["podSelector"], local[1])
        and direction in p["spec"]["policyTypes"]
    ]
    if not selecting:
        return True  # not isolated
    return any(
        (
            peers_key not in rule
            or any(_peer_is(peer, p["metadata"]["namespace"], remote) for peer in rule[peers_key])
        )
        and (
            "ports" not in rule
            or any(x.get("protocol", "TCP") == protocol and x["port"] == port for x in rule["ports"])
        )
        for p in selecting
        for rule in p["spec"].get(direction.lower(), [])
    )


def _allowed(policies, source, target, port: int, protocol: str = "TCP") -> bool:  # noqa: ANN001
    return _side_allows(policies, "Egress", source, target, port, protocol) and _side_allows(
        policies, "Ingress", target, source, port, protocol
    )


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_network_policies_admit_only_what_each_component_needs(overlay: str) -> None:
    objects = render(overlay) + build(POSTGRES_EXAMPLE)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    ports = {
        o["metadata"]["name"]: {
            p["name"]: p["containerPort"] for p in pod_spec(o)["containers"][0].get("ports", [])
        }
        for o in _workloads(objects)
    }
    coordinator = (_pod("fedprompt-coordinator"), ports["fedprompt-coordinator"]["http"])
    worker = (_pod("fedprompt-worker"), ports["fedprompt-worker"]["http"])
    postgres = (_pod("fedprompt-postgres"), ports["fedprompt-postgres"]["postgres"])
    migrate, stranger = _pod("fedprompt-migrate"), (NAMESPACE, {"app": "something-else"})

    # Every pod the manifests make is selected by a policy of its own, not only the default deny.
    for workload in _workloads(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        own = [p for p in policies if p["spec"]["podSelector"] and _selects(p["spec"]["podSelector"], labels)]
        assert [p["metadata"]["name"] for p in own] == [workload["metadata"]["name"]]
    allowed = {
        "worker -> coordinator": _allowed(policies, worker[0], coordinator[0], coordinator[1]),
        "worker -> DNS": _allowed(policies, worker[0], DNS, 53, "UDP"),
        "coordinator -> DNS": _allowed(policies, coordinator[0], DNS, 53, "UDP"),
        "coordinator -> postgres": _allowed(policies, coordinator[0], postgres[0], postgres[1]),
        "coordinator -> an outside database": _allowed(policies, coordinator[0], OUTSIDE, 5432),
        "migrate -> postgres": _allowed(policies, migrate, postgres[0], postgres[1]),
        "ingress controller -> coordinator": _allowed(
            policies, INGRESS_CONTROLLER, coordinator[0], coordinator[1]
        ),
        "prometheus -> coordinator": _allowed(policies, PROMETHEUS, coordinator[0], coordinator[1]),
        "prometheus -> worker": _allowed(policies, PROMETHEUS, worker[0], worker[1]),
    }
    refused = {
        "worker -> postgres": _allowed(policies, worker[0], postgres[0], postgres[1]),
        "worker -> outside": _allowed(policies, worker[0], OUTSIDE, 443),
        "worker -> outside on the coordinator's port": _allowed(policies, worker[0], OUTSIDE, coordinator[1]),
        "worker -> another pod on the coordinator's port": _allowed(
            policies, worker[0], stranger, coordinator[1]
        ),
        "worker -> worker": _allowed(policies, worker[0], worker[0], worker[1]),
        "worker -> coordinator on another port": _allowed(policies, worker[0], coordinator[0], 9000),
        "coordinator -> outside, not Postgres": _allowed(policies, coordinator[0], OUTSIDE, 443),
        "coordinator -> worker": _allowed(policies, coordinator[0], worker[0], worker[1]),
        "ingress controller -> worker": _allowed(policies, INGRESS_CONTROLLER, worker[0], worker[1]),
        "ingress controller -> postgres": _allowed(policies, INGRESS_CONTROLLER, postgres[0], postgres[1]),
        "another pod of the namespace -> coordinator": _allowed(
            policies, stranger, coordinator[0], coordinator[1]
        ),
        "another pod of the namespace -> postgres": _allowed(policies, stranger, postgres[0], postgres[1]),
        "postgres -> outside": _allowed(policies, postgres[0], OUTSIDE, 443),
        "migrate -> outside, not Postgres": _allowed(policies, migrate, OUTSIDE, 443),
    }
    assert [k for k, v in allowed.items() if not v] == []
    assert [k for k, v in refused.items() if v] == []


def test_the_example_postgres_reads_its_password_from_a_file_and_serves_the_documented_address() -> None:
    objects = build(POSTGRES_EXAMPLE)
    stateful = find(objects, "StatefulSet", "fedprompt-postgres")
    service = find(objects, "Service", "fedprompt-postgres")
    (container,) = _containers(stateful)
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (secret,) = [v for v in pod_spec(stateful)["volumes"] if "secret" in v]

    assert env["POSTGRES_PASSWORD_FILE"] == f"{mounts[secret['name']]}/password"
    assert secret["secret"]["secretName"] == "fedprompt-postgres"
    assert env["PGDATA"].startswith(mounts["data"] + "/")  # below the volume's root (lost+found)
    assert {env["POSTGRES_USER"], env["POSTGRES_DB"]} == {"fedprompt"}
    assert service["spec"]["selector"].items() <= stateful["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["port"] == 5432
    for path in ("/var/run/postgresql", "/tmp", "/dev/shm"):
        assert path in _writable(container)
    example = (POSTGRES_EXAMPLE / "kustomization.yaml").read_text()
    assert f"@{service['metadata']['name']}:5432/{env['POSTGRES_DB']}" in example


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


def test_compose_passes_every_secret_as_a_file_and_keeps_the_workers_root_read_only() -> None:
    spec = compose()
    services = spec["services"]

    for name, service in services.items():
        for key, value in service.get("environment", {}).items():
            if any(w in key for w in ("TOKEN", "PASSWORD", "DATABASE_URL")):
                # a path to a secret file this service mounts, never the secret itself
                assert key.endswith("_FILE"), f"{name}: {key}"
                assert value.startswith("/run/secrets/") and value.rsplit("/", 1)[1] in service["secrets"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-")}
    for name, service in workers.items():
        env = service["environment"]
        assert env["FEDPROMPT_ENROLLMENT_TOKEN_FILE"] == "/run/secrets/fedprompt_enrollment_token", name
        assert env["FEDPROMPT_WORKER_TOKEN_FILE"] == "/run/secrets/fedprompt_worker_token", name
        assert service["command"][service["command"].index("--host") + 1] == "0.0.0.0"
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
        # state and caches (HOME) go to the worker's volume
        assert any(v.endswith(":/var/lib/fedprompt") for v in service["volumes"])
    assert {s for service in services.values() for s in service.get("secrets", [])} == set(spec["secrets"])


def test_make_secrets_writes_the_files_compose_mounts_and_keeps_them(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"

    def make(**env: str) -> dict[str, str]:
        subprocess.run(
            ["sh", str(DEPLOY / "make-secrets.sh"), str(folder)],
            check=True,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", **env},
        )
        return {p.name: p.read_text() for p in folder.iterdir()}

    first = make()
    wanted = {Path(s["file"]).name for s in compose()["secrets"].values()}
    # all but the enrolment token, which comes from the coordinator once it runs
    assert wanted - {"fedprompt_enrollment_token"} | {".gitignore"} == set(first)
    assert make() == first  # a second run changes nothing
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    password = first["postgres_password"].strip()
    assert len(password) == 48
    assert first["fedprompt_database_url"].strip() == (
        f"postgresql+psycopg://fedprompt:{password}@postgres:5432/fedprompt"
    )
    assert len(first["fedprompt_admin_token"].strip()) >= 16  # the coordinator's minimum
    assert len(first["fedprompt_worker_token"].strip()) == 48
    assert first["fedprompt_worker_token"] != first["fedprompt_admin_token"]
    assert first[".gitignore"] == "*\n"

    with_token = make(FEDPROMPT_ENROLLMENT_TOKEN="fpe_first")
    assert with_token == {**first, "fedprompt_enrollment_token": "fpe_first\n"}
    assert wanted | {".gitignore"} == set(with_token)
    assert make(FEDPROMPT_ENROLLMENT_TOKEN="fpe_second")["fedprompt_enrollment_token"] == "fpe_second\n"
    for name in wanted:  # readable by the containers' user once mounted
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644


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
