"""The connection, timeout, body-size and proxy settings shipped in deploy/ are the documented ones.

compose.yaml and the Kubernetes Deployment set each of them explicitly; docs/deployment.md's table
gives the value shipped; both must agree with each other, with the table and with what the
coordinator accepts (its Settings).
"""

from __future__ import annotations

import re

from fedprompt.coordinator.config import Settings

from tests.deploy.files import ROOT, compose, find, render

CONNECTION_SETTINGS = {
    "FEDPROMPT_HEADER_TIMEOUT_S",
    "FEDPROMPT_BODY_TIMEOUT_S",
    "FEDPROMPT_KEEP_ALIVE_S",
    "FEDPROMPT_MAX_CONNECTIONS",
    "FEDPROMPT_MAX_HEADER_BYTES",
    "FEDPROMPT_MAX_REQUEST_BYTES",
    "FEDPROMPT_MAX_REQUEST_BYTES_IN_FLIGHT_PER_ADDRESS",
    "FEDPROMPT_MAX_UPLOAD_BYTES",
    "FEDPROMPT_MAX_UPLOADS_PER_CLIENT",
    "FEDPROMPT_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_CLIENT",
    "FEDPROMPT_TRUSTED_PROXIES",
}


def _documented() -> dict[str, str]:
    """`setting` → shipped value, from the table of docs/deployment.md."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    rows = re.findall(r"^\| `(FEDPROMPT_[A-Z_]+)` \| `([^`]*)`", text, flags=re.M)
    return {name: "" if value == '""' else value for name, value in rows if name in CONNECTION_SETTINGS}


def test_compose_and_kubernetes_ship_the_documented_connection_settings() -> None:
    shipped_compose = {
        k: str(v) for k, v in compose()["x-coordinator"]["environment"].items() if k in CONNECTION_SETTINGS
    }
    for overlay in ("cpu", "gpu"):
        (container,) = find(render(overlay), "Deployment", "fedprompt-coordinator")["spec"]["template"][
            "spec"
        ]["containers"]
        shipped_k8s = {e["name"]: e["value"] for e in container["env"] if e["name"] in CONNECTION_SETTINGS}
        assert shipped_k8s == shipped_compose
    assert set(shipped_compose) == CONNECTION_SETTINGS
    assert _documented() == shipped_compose


def test_the_shipped_values_are_the_defaults_and_valid(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    shipped = {
        k: str(v) for k, v in compose()["x-coordinator"]["environment"].items() if k in CONNECTION_SETTINGS
    }
    defaults = Settings(admin_token="x" * 16)
    for name, value in shipped.items():
        monkeypatch.setenv(name, value)
    configured = Settings(admin_token="x" * 16)
    for name in shipped:
        field = name.removeprefix("FEDPROMPT_").lower()
        assert getattr(configured, field) == getattr(defaults, field), name
