"""The Kubernetes manifests' own commands, run for real on this machine against the local Postgres.

No container engine runs here, so the pods' processes are started directly: the migration Job's,
the coordinator Deployment's (two replicas) and the worker StatefulSet's (three pods) command and
arguments, exactly as rendered, with the environment the image (Dockerfile ENV) and the manifest
(env, ConfigMap and Secret references, the downward API) give them. What a cluster provides is
translated, and only that: each mounted volume becomes a local folder (a Secret volume holds its
keys as files), the coordinator Service's address becomes one of the two replicas, and the bind
address and port move to 127.0.0.1 and a free port because the processes share one network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.local import free_port, wait_ready
from fedprompt.worker.data.dataset import datasets_dir
from fedprompt.worker.shards import ShardSpec, load_shard

from tests.deploy.files import DOCKERFILES, OVERLAYS, dockerfile_stages, find, pod_spec, render
from tests.helpers import ADMIN, stop_all, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SERVICE_URL = "http://fedprompt-coordinator:8000"
WORKER_TOKEN = "worker-token-from-a-secret-file-0123456789"
PARTITION = "quantity:2.0"  # unequal shares, so each client's size tells which partition it got
SMALL = "--device cpu --threads 1 --train-limit 240 --eval-limit 60 --poll-wait 1"
SPEC: dict[str, Any] = {
    "name": "deploy",
    "max_length": 48,
    "batch_size": 8,
    "lr": 0.3,
    "min_clients": 3,
    "rounds": 1,
    "local_steps": 2,
    "quorum": 1,
}


class Pod:
    """Turns one rendered container into a local command line and environment."""

    def __init__(self, objects: list[dict[str, Any]], workload: dict[str, Any], image: str, workdir: Path):
        self.objects = objects
        self.spec = pod_spec(workload)
        (self.container,) = self.spec["containers"]
        self.image_env = dockerfile_stages(DOCKERFILES[image])[-1].env()
        self.workdir = workdir
        self.mounts: dict[str, Path] = {}

    def mount(self, secrets: dict[str, dict[str, str]]) -> None:
        """A local folder per volume mount; a Secret volume gets its keys (or its items) as files."""
        volumes = {v["name"]: v for v in self.spec.get("volumes", [])}
        for m in self.container.get("volumeMounts", []):
            volume = volumes.get(m["name"], {})
            if "persistentVolumeClaim" in volume:  # the operator's data set claim: this machine's data sets
                local = datasets_dir()
            else:
                local = self.workdir / m["name"]
                local.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = secrets[volume["secret"]["secretName"]]
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (local / item["path"]).write_text(data[item["key"]])
            self.mounts[m["mountPath"]] = local

    def env(
        self, secrets: dict[str, dict[str, str]], pod_name: str, overrides: dict[str, str]
    ) -> dict[str, str]:
        """The container's environment, as the kubelet would build it, with local paths."""
        config = {o["metadata"]["name"]: o["data"] for o in self.objects if o["kind"] == "ConfigMap"}
        env = dict(self.image_env)
        for item in self.container.get("env", []):
            ref = item.get("valueFrom")
            if ref is None:
                env[item["name"]] = item["value"]
            elif "configMapKeyRef" in ref:
                env[item["name"]] = config[ref["configMapKeyRef"]["name"]][ref["configMapKeyRef"]["key"]]
            elif "secretKeyRef" in ref:
                env[item["name"]] = secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
            else:
                assert ref == {"fieldRef": {"fieldPath": "metadata.name"}}, ref
                env[item["name"]] = pod_name
        for name, value in env.items():  # a path in a mounted volume: the same path in its folder
            for mount_path, local in self.mounts.items():
                if value == mount_path or value.startswith(mount_path + "/"):
                    env[name] = str(local) + value[len(mount_path) :]
        env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # the image's /opt/fedprompt/bin
        env["HOME"] = str(self.workdir)
        return {**env, **overrides}

    def argv(self) -> list[str]:
        """command + args, as the container runs them."""
        return [*self.container["command"], *self.container.get("args", [])]


def _status(url: str) -> dict[str, Any] | None:
    """A worker's /status, asked with the worker token its Secret holds."""
    try:
        return httpx.get(
            f"{url}/status", headers={"Authorization": f"Bearer {WORKER_TOKEN}"}, timeout=2
        ).json()
    except httpx.HTTPError:
        return None


def _test_overlay(tmp_path: Path) -> Path:
    """The CPU overlay with a small, unequal split: what an operator's own overlay would change."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        f"resources:\n  - {OVERLAYS['cpu']}\n"
        "patches:\n  - target: {kind: ConfigMap, name: fedprompt}\n    patch: |-\n"
        f"      - {{op: replace, path: /data/FEDPROMPT_PARTITION, value: '{PARTITION}'}}\n"
        f"      - {{op: replace, path: /data/FEDPROMPT_WORKER_ARGS, value: '{SMALL}'}}\n"
    )
    return overlay


def test_migrate_two_coordinators_three_workers_one_round(pg_url: str, tmp_path: Path) -> None:
    objects = render(_test_overlay(tmp_path))
    config = find(objects, "ConfigMap", "fedprompt")["data"]
    secrets = {"fedprompt-coordinator": {"fedprompt_database_url": pg_url, "fedprompt_admin_token": ADMIN}}
    procs: list[subprocess.Popen] = []
    logs = []

    def start(argv: list[str], env: dict[str, str], log_name: str) -> subprocess.Popen:
        log = open(tmp_path / log_name, "wb")  # noqa: SIM115 - closed at the end
        logs.append(log)
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        # 1. The migration Job, to completion.
        job = Pod(objects, find(objects, "Job", "fedprompt-migrate"), "coordinator", tmp_path / "migrate")
        job.mount(secrets)
        done = subprocess.run(
            job.argv(),
            env=job.env(secrets, "fedprompt-migrate-x", {}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "database at head" in done.stdout

        # 2. The coordinator Deployment's two replicas, started together, ready by their readiness probe.
        deployment = find(objects, "Deployment", "fedprompt-coordinator")
        replicas = []
        for replica in range(deployment["spec"]["replicas"]):
            pod = Pod(objects, deployment, "coordinator", tmp_path / f"coordinator-{replica}")
            pod.mount(secrets)
            port = free_port()
            env = pod.env(
                secrets,
                f"fedprompt-coordinator-{replica}",
                {"FEDPROMPT_HOST": "127.0.0.1", "FEDPROMPT_PORT": str(port)},
            )
            assert env["FEDPROMPT_SECRETS_DIR"] == str(tmp_path / f"coordinator-{replica}" / "secrets")
            assert pod.container["readinessProbe"]["httpGet"]["path"] == "/readyz"  # what wait_ready polls
            replicas.append(
                (f"http://127.0.0.1:{port}", start(pod.argv(), env, f"coordinator-{replica}.log"))
            )
        for url, proc in replicas:
            wait_ready(
                url, 60, lambda p=proc: p.poll() is None or pytest.fail(f"replica exited {p.returncode}")
            )
        urls = [url for url, _ in replicas]
        assert len(urls) == 2

        # 3. A federation through the API; its id is the one the workers' ConfigMap names.
        admin = CoordinatorClient(urls[0], ADMIN)
        fid = admin.create_federation(SPEC).id
        assert str(fid) == config["FEDPROMPT_FEDERATION"]
        secrets["fedprompt-worker"] = {
            "enrollment-token": admin.create_enrollment_token(fid, max_uses=3),
            "worker-token": WORKER_TOKEN,
        }

        # 4. The StatefulSet's three pods; odd ordinals reach the second replica.
        stateful = find(objects, "StatefulSet", "fedprompt-worker")
        workers = {}
        for ordinal in range(stateful["spec"]["replicas"]):
            name = f"{stateful['metadata']['name']}-{ordinal}"
            pod = Pod(objects, stateful, "worker", tmp_path / name)
            pod.mount(secrets)
            port = free_port()
            overrides = {
                "FEDPROMPT_COORDINATOR": urls[ordinal % 2],
                "FEDPROMPT_WORKER_HOST": "127.0.0.1",
                "FEDPROMPT_WORKER_PORT": str(port),
            }
            env = pod.env(secrets, name, overrides)
            assert {"name": "FEDPROMPT_COORDINATOR", "value": SERVICE_URL} in pod.container["env"]
            assert env["FEDPROMPT_STATE_DIR"] == str(tmp_path / name / "state")
            # the tokens as files of the mounted Secret, the caches in their own volume
            assert Path(env["FEDPROMPT_WORKER_TOKEN_FILE"]).read_text() == WORKER_TOKEN
            assert Path(env["FEDPROMPT_ENROLLMENT_TOKEN_FILE"]).parent == tmp_path / name / "secrets"
            assert env["HF_HOME"] == str(tmp_path / name / "cache" / "huggingface")
            start(pod.argv(), env, f"{name}.log")
            workers[name] = f"http://127.0.0.1:{port}"

        # 5. One round closes with all three updates; every replica reports the same.
        wait_for(lambda: admin.federation(fid).state == "completed", 300, "round 1 to close")
        for url in urls:
            (round1,) = CoordinatorClient(url, ADMIN).rounds(fid)
            assert round1["state"] == "closed" and round1["stats"]["updates"] == 3

        # Each pod trained the partition its ordinal names, on the CPU the overlay asks for.
        sizes = {c["name"]: c["num_samples"] for c in admin.clients(fid)}
        expected = {
            f"fedprompt-worker-{i}": len(
                load_shard(
                    ShardSpec(
                        data=config["FEDPROMPT_DATA"],
                        partition=PARTITION,
                        num_partitions=int(config["FEDPROMPT_NUM_PARTITIONS"]),
                        partition_id=i,
                        train_limit=240,
                        eval_limit=60,
                    )
                )[0]
            )
            for i in range(3)
        }
        assert sizes == expected and len(set(sizes.values())) == 3
        for name, url in workers.items():
            status = wait_for(lambda u=url: _status(u), 30, f"{name} status")
            assert status["rounds_trained"] == [1] and status["device"] == "cpu"
            assert any((tmp_path / name / "state").iterdir())  # credentials on the pod's own volume
    finally:
        stop_all(procs)
        for log in logs:
            log.close()
        if os.environ.get("FEDPROMPT_KEEP_DEPLOY_LOGS"):
            print(*(p.read_text() for p in tmp_path.glob("*.log")))
