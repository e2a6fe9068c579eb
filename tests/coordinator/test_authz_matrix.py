"""Authorisation matrix: every API route × {no token, wrong token, other federation's client,
client token, admin token} answers as designed, and a refused call changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.migrate import upgrade

from tests.coordinator.test_api import snapshot
from tests.helpers import ADMIN, SMALL_SPEC, federation_with_clients, update_blob

PUBLIC, ADMIN_ONLY, CLIENT, EITHER, ENROL = "public", "admin", "client", "either", "enrol"

ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/api/v1/federations"): ADMIN_ONLY,
    ("POST", "/api/v1/federations"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/pause"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/resume"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/events"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/spec"): EITHER,
    ("GET", "/api/v1/federations/{fid}/prompts/{version}"): EITHER,
    ("GET", "/api/v1/federations/{fid}/prompts/{version}/control"): EITHER,
    ("PUT", "/api/v1/federations/{fid}/prompts/0"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/export"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/enrollment-tokens"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/clients"): ENROL,
    ("GET", "/api/v1/federations/{fid}/clients"): ADMIN_ONLY,
    ("PUT", "/api/v1/federations/{fid}/model-parameters"): CLIENT,
    ("PUT", "/api/v1/federations/{fid}/activity"): CLIENT,
    ("DELETE", "/api/v1/federations/{fid}/clients/{cid}"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/rounds"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/rounds"): ADMIN_ONLY,
    ("POST", "/api/v1/federations/{fid}/rounds/{number}/close"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/rounds/{number}"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/evaluations/{version}"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/evaluations/{version}/sites"): ADMIN_ONLY,
    ("GET", "/api/v1/federations/{fid}/task"): CLIENT,
    ("PUT", "/api/v1/federations/{fid}/rounds/{number}/update"): CLIENT,
    ("POST", "/api/v1/federations/{fid}/rounds/{number}/evaluation"): CLIENT,
    ("POST", "/api/v1/federations/{fid}/rounds/{number}/secagg/{stage}"): CLIENT,
}
TOKENS = ["none", "wrong", "other-federation client", "client", "admin"]

# Expected status for a refused call; None means "allowed": any answer but 401/403.
EXPECTED: dict[str, dict[str, int | None]] = {
    PUBLIC: dict.fromkeys(TOKENS),
    ADMIN_ONLY: {"none": 401, "wrong": 403, "other-federation client": 403, "client": 403, "admin": None},
    CLIENT: {"none": 401, "wrong": 401, "other-federation client": 403, "client": None, "admin": 401},
    EITHER: {"none": 401, "wrong": 401, "other-federation client": 403, "client": None, "admin": None},
    ENROL: {"none": 401, "wrong": 401, "other-federation client": 401, "client": 401, "admin": 401},
}


@contextmanager
def _world(tmp_path: Path, **settings: Any) -> Iterator[dict[str, Any]]:
    url = f"sqlite:///{tmp_path / 'authz.db'}"
    upgrade(url)
    app = create_app(
        Settings(database_url=url, admin_token=ADMIN, data_dir=tmp_path, **settings), sweep=False
    )
    with TestClient(app) as api:
        ids, tokens = [], []
        for name in ("a", "b"):
            fid, _, clients = federation_with_clients(api, 2, spec={**SMALL_SPEC, "name": name}, prefix=name)
            ids.append(fid)
            tokens.append(clients)
        yield {"api": api, "fid": ids[0], "clients": tokens[0], "other": tokens[1][0]}


@pytest.fixture(scope="module")
def refusing_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One world for every call that must be refused: each such test asserts that its call changed
    nothing, so the next one finds the world as it was. Its limit on failed authentications is raised
    past the matrix's hundred-odd refusals, which would otherwise turn the later 401s into 429s."""
    with _world(tmp_path_factory.mktemp("authz"), failed_auth_rate_limit="100000/minute") as world:
        yield world


@pytest.fixture
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A fresh world for a call that is allowed (it may change it), the shared one for a refusal."""
    params = request.node.callspec.params
    if EXPECTED[ROUTES[params["route"]]][params["who"]] is not None:
        yield request.getfixturevalue("refusing_world")
        return
    with _world(tmp_path) as world:
        yield world


def test_every_route_is_classified() -> None:
    app = create_app(Settings(database_url="sqlite://", admin_token=ADMIN), sweep=False)
    documented = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    assert documented == set(ROUTES)


@pytest.mark.parametrize("route", list(ROUTES), ids=lambda r: f"{r[0]} {r[1]}")
@pytest.mark.parametrize("who", TOKENS)
def test_route_answers_each_token_as_designed(
    world: dict[str, Any], route: tuple[str, str], who: str
) -> None:
    api: TestClient = world["api"]
    method, template = route
    me = world["clients"][0]
    path = template.format(
        fid=world["fid"], cid=world["clients"][1]["client_id"], version=0, number=1, stage="keys"
    )
    if template.endswith("/evaluation"):
        path = template.format(fid=world["fid"], number=0)
    headers = {
        "none": {},
        "wrong": {"Authorization": "Bearer fpc_this-is-not-a-token"},
        "other-federation client": {"Authorization": f"Bearer {world['other']['token']}"},
        "client": {"Authorization": f"Bearer {me['token']}"},
        "admin": {"Authorization": f"Bearer {ADMIN}"},
    }[who]
    kwargs: dict[str, Any] = {}
    if template.endswith("/update") or template.endswith("/prompts/0"):
        kwargs["content"] = update_blob(SMALL_SPEC, 1, base_version=0)
    elif template.endswith("/evaluation"):
        kwargs["json"] = {"num_samples": 3, "accuracy": 0.5}
    elif template == "/api/v1/federations":
        kwargs["json"] = SMALL_SPEC
    elif method == "POST" and template.endswith("/clients"):
        kwargs["json"] = {"name": "intruder", "num_samples": 1}
    elif template.endswith("/model-parameters"):
        kwargs["json"] = {"model_parameters": 1}
    elif template.endswith("/activity"):
        kwargs["json"] = {"phase": "training", "round": 1, "step": 0, "total_steps": 5}
    elif template.endswith("/secagg/{stage}"):
        kwargs["json"] = {"encryption_key": "", "mask_key": "", "seed_commitment": ""}
    before = snapshot(api)
    resp = api.request(method, path, headers=headers, **kwargs)
    expected = EXPECTED[ROUTES[route]][who]
    if expected is None:
        assert resp.status_code not in (401, 403), resp.text
        assert resp.status_code < 500, resp.text
    else:
        assert resp.status_code == expected, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert snapshot(api) == before
