"""schemathesis over the coordinator's whole OpenAPI: no 5xx, and every answer matches the schema.

Each operation is called with the valid token its OpenAPI ``security`` names (operations that take
either the admin or a client token are called with both), against one federation with enrolled
clients and an open round, so that generated requests reach the services rather than stopping at
authentication. Examples are bounded (FEDPROMPT_SCHEMATHESIS_EXAMPLES per operation, default 25) and
derandomised, so the run is repeatable; raise the count to fuzz harder locally.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from coordinator.app import create_app
from coordinator.config import Settings
from coordinator.migrate import upgrade
from tests.helpers import ADMIN, federation_with_clients

EXAMPLES = int(os.environ.get("FEDPROMPT_SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance, content_type_conformance]


def _app(url: str, data_dir: Any) -> Any:
    # Rate limits off: thousands of generated calls from one address are not what they guard against
    # (tests/coordinator/test_ratelimit.py covers them).
    return create_app(
        Settings(
            database_url=url, admin_token=ADMIN, data_dir=data_dir, max_upload_bytes=4096, rate_limits=False
        ),
        sweep=False,
    )


# The schema is read from an app without a database (the OpenAPI needs none); the calls go to
# the fixture's app, which has one.
schema = schemathesis.openapi.from_asgi("/openapi.json", _app("sqlite://", "data"))
OPENAPI = _app("sqlite://", "data").openapi()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("schemathesis")
    url = f"sqlite:///{folder / 'fuzz.db'}"
    upgrade(url)
    app = _app(url, folder)
    with TestClient(app) as api:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        fid, enrol, clients = federation_with_clients(api, 3)
        # min_clients is 2 and auto_advance is on: enrolment opened round 1.
        assert api.get(f"/api/v1/federations/{fid}/rounds/1", headers=admin).json()["state"] == "open"
        yield {
            "app": app,
            "fid": fid,
            "tokens": {"admin": ADMIN, "client": clients[0]["token"], "enrolment": enrol},
            # DELETE …/clients/{cid} may revoke only the spare client, so the others keep working.
            "keep": {clients[0]["client_id"], clients[1]["client_id"]},
            "spare": clients[2]["client_id"],
        }


def _schemes(path: str, method: str) -> list[str]:
    security = OPENAPI["paths"][path][method.lower()].get("security") or [{}]
    return [next(iter(requirement), "") for requirement in security]


def test_every_operation_is_fuzzed() -> None:
    fuzzed = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    documented = {(m.upper(), p) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert fuzzed == documented and len(documented) >= 20


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case: Any, world: dict[str, Any]) -> None:
    params = case.path_parameters
    if params is not None and "fid" in params:
        params["fid"] = world["fid"]
    if params is not None and params.get("cid") in world["keep"]:
        params["cid"] = world["spare"]
    for scheme in _schemes(case.operation.path, case.operation.method):
        headers = {"Authorization": f"Bearer {world['tokens'][scheme]}"} if scheme else {}
        case.call_and_validate(app=world["app"], headers=headers, checks=CHECKS)
