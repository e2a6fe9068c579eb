"""schemathesis over the coordinator's whole OpenAPI: no 5xx, every answer matches the schema, and
the schema says what the server accepts.

Each operation is called with the valid token its OpenAPI ``security`` names (operations that take
either the admin or a client token are called with both), against one federation with enrolled
clients and an open round, so that generated requests reach the services rather than stopping at
authentication. Three passes:

- **real ids**: every generated federation id is replaced with the real one, so requests reach the
  federation's state (only the spare client may be revoked);
- **generated ids**: path parameters go through as generated, hostile ones included (ids out of
  range, of the wrong type, negative data), so that what reaches routing and logging is fuzzed too;
- **stateful**: the served OpenAPI, whose links (coordinator/api/links.py: a federation's id from its
  creation to every operation on it, an enrolment token to the enrolment, a client's id and token to
  its own operations, a round number to the round) run as a state machine: create, enrol, open,
  close, revoke, export, ….

Checks: no server error; status code, content type and body of every answer as documented;
negative data refused (``negative_data_rejection``: ``expires_in_s: true`` is not 1); valid data
not refused as malformed (400 or 422) except by the rules a JSON schema cannot state (a spec's
cross-field rules, a prompt's safetensors content). Examples are bounded and derandomised
(FEDPROMPT_SCHEMATHESIS_EXAMPLES per operation and pass, default 25; the state machine runs
FEDPROMPT_SCHEMATHESIS_SCENARIOS scenarios, default 25); raise them to fuzz harder.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.migrate import upgrade
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import ADMIN, SMALL_SPEC, federation_with_clients

EXAMPLES = int(os.environ.get("FEDPROMPT_SCHEMATHESIS_EXAMPLES", "25"))
SCENARIOS = int(os.environ.get("FEDPROMPT_SCHEMATHESIS_SCENARIOS", "25"))
HYPOTHESIS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": list(HealthCheck),
}
# Operations whose valid-by-schema input may still be refused with 422 for a reason no JSON schema
# states: a spec's cross-field rules (quorum <= min_clients, a [MASK] in the template, a prompt that
# fits the upload limit, a registered aggregation rule), a body that is not a prompt for this
# federation (safetensors names, shapes, metadata).
SEMANTIC_422 = {
    ("POST", "/api/v1/federations"),
    ("PUT", "/api/v1/federations/{fid}/prompts/0"),
    ("PUT", "/api/v1/federations/{fid}/rounds/{number}/update"),
}


def positive_data_acceptance(ctx: Any, response: Any, case: Any) -> bool | None:
    """Data the schema calls valid is not refused as malformed (400, 422; see SEMANTIC_422)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code not in (400, 422):
        return None
    if response.status_code == 422 and (case.operation.method.upper(), case.operation.path) in SEMANTIC_422:
        return None
    raise AssertionError(
        f"valid data refused with {response.status_code}: {case.operation.label}: {response.text[:300]}"
    )


CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
]


def _negative_at(case: Any, location: ParameterLocation) -> bool:
    """Whether the case's invalid part may be at this location (then the test leaves it as it is)."""
    return (
        case.meta is not None and case.meta.generation.mode.is_negative and case.meta.is_negative_at(location)
    )


def _app(url: str, data_dir: Any) -> Any:
    # Rate limits off: thousands of generated calls from one address are not what they guard against
    # (tests/coordinator/test_ratelimit.py covers them). Long-polls short: a generated wait of 300 s
    # would otherwise hold a step for the server's 30 s.
    return create_app(
        Settings(
            database_url=url,
            admin_token=ADMIN,
            data_dir=data_dir,
            max_upload_bytes=4096,
            rate_limits=False,
            long_poll_max_s=0.2,
        ),
        sweep=False,
    )


# The schema is read from an app without a database (the OpenAPI needs none); the calls go to
# the fixture's app, which has one.
schema = schemathesis.openapi.from_asgi("/openapi.json", _app("sqlite://", "data"))
OPENAPI = _app("sqlite://", "data").openapi()
WORLD: dict[str, Any] = {}


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
        WORLD.update(
            {
                "app": app,
                "fid": fid,
                "tokens": {"admin": ADMIN, "client": clients[0]["token"], "enrolment": enrol},
                # DELETE …/clients/{cid} may revoke only the spare client, so the others keep working.
                "keep": {clients[0]["client_id"], clients[1]["client_id"]},
                "spare": clients[2]["client_id"],
            }
        )
        yield WORLD


def _schemes(path: str, method: str) -> list[str]:
    security = OPENAPI["paths"][path][method.lower()].get("security") or [{}]
    return [next(iter(requirement), "") for requirement in security]


def _protect(params: dict[str, Any] | None, world: dict[str, Any]) -> None:
    """Keep the clients the world needs: a revocation in its federation hits only the spare one."""
    if params is not None and params.get("fid") == world["fid"] and params.get("cid") in world["keep"]:
        params["cid"] = world["spare"]


def _call_with_each_token(case: Any, world: dict[str, Any]) -> None:
    """Call with each token the operation takes; a case whose invalid part may be its Authorization
    header (missing, malformed) is sent as generated, once."""
    if _negative_at(case, ParameterLocation.HEADER):
        case.call_and_validate(app=world["app"], checks=CHECKS)
        return
    for scheme in _schemes(case.operation.path, case.operation.method):
        headers = {"Authorization": f"Bearer {world['tokens'][scheme]}"} if scheme else {}
        case.call_and_validate(app=world["app"], headers=headers, checks=CHECKS)


def test_every_operation_is_fuzzed() -> None:
    fuzzed = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    documented = {(m.upper(), p) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert fuzzed == documented and len(documented) >= 20


@schema.parametrize()
@settings(max_examples=EXAMPLES, **HYPOTHESIS)
def test_api_conforms_to_its_schema(case: Any, world: dict[str, Any]) -> None:
    """Real ids: every federation id is the world's."""
    params = case.path_parameters
    if params is not None and "fid" in params and not _negative_at(case, ParameterLocation.PATH):
        params["fid"] = world["fid"]
    _protect(params, world)
    _call_with_each_token(case, world)


@schema.parametrize()
@settings(max_examples=EXAMPLES, **HYPOTHESIS)
def test_generated_path_parameters_are_refused_cleanly(case: Any, world: dict[str, Any]) -> None:
    """Generated ids: path parameters as generated, hostile ones included."""
    _protect(case.path_parameters, world)
    _call_with_each_token(case, world)


# --- the stateful phase ---------------------------------------------------------------------------

stateful_schema = schemathesis.openapi.from_dict(OPENAPI)  # the served schema, with its links


def _default_auth(case: Any) -> dict[str, str]:
    """The token a step sends: the one its link gave it (an enrolment or client token of a federation
    made in the scenario), else the world's token of the operation's first scheme (the admin's where
    it opens the operation); a case whose invalid part may be its header is sent as generated."""
    given = next((v for k, v in (case.headers or {}).items() if k.lower() == "authorization"), "")
    if _negative_at(case, ParameterLocation.HEADER) or str(given).startswith(("Bearer fpe_", "Bearer fpc_")):
        return {}
    scheme = _schemes(case.operation.path, case.operation.method)[0]
    return {"Authorization": f"Bearer {WORLD['tokens'][scheme]}"} if scheme else {}


STEPS: Counter[tuple[str, str, int]] = Counter()


class Workflow(stateful_schema.as_state_machine()):  # type: ignore[misc]
    def before_call(self, case: Any) -> None:
        # A generated spec almost never meets a spec's cross-field rules (a [MASK] in the template,
        # quorum <= min_clients, a prompt within the upload limit): the stateless passes fuzz them;
        # here a workflow starts from a federation that exists.
        if (case.operation.method.upper(), case.operation.path) == ("POST", "/api/v1/federations") and not (
            case.meta is not None and case.meta.generation.mode.is_negative
        ):
            case.body = {**SMALL_SPEC, "name": f"workflow-{len(STEPS)}"}

    def after_call(self, response: Any, case: Any) -> None:
        STEPS[(case.operation.method.upper(), case.operation.path, response.status_code)] += 1

    def get_call_kwargs(self, case: Any) -> dict[str, Any]:
        _protect(case.path_parameters, WORLD)
        return {"app": WORLD["app"], "headers": _default_auth(case)}

    def validate_response(
        self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any
    ) -> None:
        case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)


def test_the_served_openapi_links_the_operations() -> None:
    links = [
        (path, method, name)
        for path, ops in OPENAPI["paths"].items()
        for method, op in ops.items()
        for response in op["responses"].values()
        for name in response.get("links", {})
    ]
    assert len(links) >= 30


def test_stateful_workflows_conform(world: dict[str, Any]) -> None:
    STEPS.clear()
    Workflow.run(
        settings=settings(max_examples=SCENARIOS, stateful_step_count=10, **HYPOTHESIS)  # type: ignore[arg-type]
    )
    for key, n in sorted(STEPS.items()):
        print(n, *key)
    # the links carried real state: federations created, then enrolled in with their own tokens
    created = {path for method, path, status in STEPS if status in (200, 201, 204)}
    assert "/api/v1/federations" in created
