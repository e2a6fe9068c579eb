"""`kustomize build` for the subset of kustomize that deploy/k8s uses, in Python.

No kustomize binary installs from PyPI for this project's Python (the one wheel that bundles
kustomize's Go library needs Python >= 3.14), so the tests render the overlays with this. It is
strict: any kustomization field, patch operation or resource kind outside the subset below is an
error, never silently ignored. test_manifests.py checks its output against `kubectl kustomize`
wherever kubectl is installed.

Supported: `resources` (files, possibly multi-document, and kustomization folders), `namespace`,
`labels` (pairs, without includeSelectors / includeTemplates: metadata.labels only), `images`
(name, newName, newTag, digest) and `patches` (JSON 6902 operations add / replace / remove, inline
or from a file, selected by kind and name). Output order is kustomize's default ("legacy") order.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml


class KustomizeError(ValueError):
    """The kustomization cannot be rendered (or uses what this renderer does not support)."""


KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "PriorityClass"}
NAMESPACED = {
    "ConfigMap",
    "Secret",
    "Service",
    "ServiceAccount",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "CronJob",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "Ingress",
}
# kustomize api/resid/gvk.go: the "legacy" sort order (kinds not listed sort between the two lists).
ORDER_FIRST = [
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
]
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


def build(path: str | Path) -> list[dict[str, Any]]:
    """Render the kustomization in folder `path` into its list of objects."""
    return sorted(_build(Path(path).resolve(), ()), key=_legacy_key)


def _kustomization_file(folder: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (folder / name).is_file():
            return folder / name
    raise KustomizeError(f"{folder}: no kustomization.yaml")


def _build(folder: Path, seen: tuple[Path, ...]) -> list[dict[str, Any]]:
    if folder in seen:
        raise KustomizeError(f"{folder}: kustomization cycle")
    kfile = _kustomization_file(folder)
    spec = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(spec) - SUPPORTED_FIELDS
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported field(s) {sorted(unknown)}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{kfile}: kind must be Kustomization")

    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources") or []:
        target = (folder / entry).resolve()
        if target.is_dir():
            objects += _build(target, (*seen, folder))
        elif target.is_file():
            if not target.is_relative_to(folder):
                raise KustomizeError(f"{kfile}: file {entry} is outside the kustomization's folder")
            objects += _load_objects(target)
        else:
            raise KustomizeError(f"{kfile}: resource {entry} does not exist")
    _check_unique(objects, kfile)

    for patch in spec.get("patches") or []:
        _apply_patch(objects, patch, folder, kfile)
    for image in spec.get("images") or []:
        _set_image(objects, image, kfile)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    for group in spec.get("labels") or []:
        if set(group) - {"pairs", "includeSelectors", "includeTemplates"}:
            raise KustomizeError(f"{kfile}: unsupported labels entry {group}")
        if group.get("includeSelectors") or group.get("includeTemplates"):
            raise KustomizeError(f"{kfile}: labels with includeSelectors/includeTemplates are not supported")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(group["pairs"])
    return objects


def _load_objects(path: Path) -> list[dict[str, Any]]:
    objects = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not {"apiVersion", "kind", "metadata"} <= set(doc):
            raise KustomizeError(f"{path}: every document needs apiVersion, kind and metadata")
        if doc["kind"] not in CLUSTER_SCOPED | NAMESPACED:
            raise KustomizeError(f"{path}: kind {doc['kind']} is not supported by this renderer")
        objects.append(doc)
    return objects


def _check_unique(objects: list[dict[str, Any]], kfile: Path) -> None:
    ids = [
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects
    ]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise KustomizeError(f"{kfile}: resources defined twice: {sorted(map(str, dupes))}")


def _apply_patch(objects: list[dict[str, Any]], patch: dict[str, Any], folder: Path, kfile: Path) -> None:
    if set(patch) - {"target", "patch", "path"} or "target" not in patch:
        raise KustomizeError(f"{kfile}: a patch needs a target and a patch or a path: {patch}")
    target = patch["target"]
    if set(target) - {"kind", "name"}:
        raise KustomizeError(f"{kfile}: patch targets select by kind and name only: {target}")
    text = patch["patch"] if "patch" in patch else (folder / patch["path"]).read_text()
    ops = yaml.safe_load(text)
    if not isinstance(ops, list):
        raise KustomizeError(f"{kfile}: only JSON 6902 patches (a list of operations) are supported")
    matched = [
        o
        for o in objects
        if o["kind"] == target.get("kind", o["kind"])
        and o["metadata"]["name"] == target.get("name", o["metadata"]["name"])
    ]
    if not matched:
        raise KustomizeError(f"{kfile}: patch target {target} matches no resource")
    for obj in matched:
        for op in ops:
            _json_patch(obj, op, kfile)


def _pointer(path: str, kfile: Path) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"{kfile}: JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(obj: dict[str, Any], op: dict[str, Any], kfile: Path) -> None:
    kind = op.get("op")
    if kind not in {"add", "replace", "remove"}:
        raise KustomizeError(f"{kfile}: patch operation {kind!r} is not supported")
    *parents, last = _pointer(op["path"], kfile)
    node: Any = obj
    for key in parents:
        try:
            node = node[int(key)] if isinstance(node, list) else node[key]
        except (KeyError, IndexError, ValueError):
            raise KustomizeError(f"{kfile}: path {op['path']} does not exist in {obj['kind']}") from None
    value = copy.deepcopy(op.get("value"))
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if kind == "add":
            node.insert(index, value)
        elif index >= len(node):
            raise KustomizeError(f"{kfile}: path {op['path']} does not exist in {obj['kind']}")
        elif kind == "replace":
            node[index] = value
        else:
            del node[index]
    elif isinstance(node, dict):
        if kind != "add" and last not in node:
            raise KustomizeError(f"{kfile}: path {op['path']} does not exist in {obj['kind']}")
        if kind == "remove":
            del node[last]
        else:
            node[last] = value
    else:
        raise KustomizeError(f"{kfile}: path {op['path']} does not lead into an object or list")


def _split_image(image: str) -> tuple[str, str]:
    """('registry/name', ':tag' or '@digest' or '')."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _containers(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                found += [c for c in value if isinstance(c, dict)]
            else:
                found += _containers(value)
    elif isinstance(node, list):
        for item in node:
            found += _containers(item)
    return found


def _set_image(objects: list[dict[str, Any]], rule: dict[str, Any], kfile: Path) -> None:
    if set(rule) - {"name", "newName", "newTag", "digest"} or "name" not in rule:
        raise KustomizeError(f"{kfile}: unsupported images entry {rule}")
    for obj in objects:
        for container in _containers(obj.get("spec", {})):
            name, suffix = _split_image(container.get("image", ""))
            if name != rule["name"]:
                continue
            if "digest" in rule:
                suffix = "@" + rule["digest"]
            elif "newTag" in rule:
                suffix = ":" + str(rule["newTag"])
            container["image"] = rule.get("newName", name) + suffix


def _legacy_key(obj: dict[str, Any]) -> tuple[int, str, str, str]:
    kind = obj["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind) - len(ORDER_FIRST)
    elif kind in ORDER_LAST:
        rank = 1 + ORDER_LAST.index(kind)
    else:
        rank = 0
    gvk = f"{obj['apiVersion']}/{kind}"
    return rank, gvk, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
