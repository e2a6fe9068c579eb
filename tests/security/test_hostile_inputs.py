"""Each input that made the coordinator answer 500 (or log a secret) is refused with a 4xx problem+json.

Against a real `serve` process on SQLite and on Postgres: the hostile request, the expected status,
the database unchanged (every row of every table), and the lines the request added to the log: no
admin, client or enrolment token, nothing of the request body, no error trace, a few KB at most.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

import httpx
import pytest
from fedprompt.shared import wire

from tests.helpers import ADMIN, SMALL_SPEC, random_tensors
from tests.security.conftest import (
    ADMIN_H,
    LOG_BYTES_PER_REQUEST,
    World,
    assert_clean_log,
    request_id,
    snapshot,
)


def hostile(
    world: World,
    method: str,
    path: str,
    *,
    expect: int | tuple[int, ...],
    headers: dict[str, str] | None = None,
    markers: tuple[str, ...] = (),
    **kwargs: Any,
) -> httpx.Response:
    """Send one hostile request and check the answer, the database and the log it caused."""
    before = snapshot(world.db)
    offset = world.server.log_size()
    rid = request_id()
    resp = httpx.request(
        method, world.url + path, headers={**(headers or {}), "X-Request-ID": rid}, timeout=30, **kwargs
    )
    expected = (expect,) if isinstance(expect, int) else expect
    assert resp.status_code in expected, (resp.status_code, resp.text[:500])
    assert resp.headers["content-type"].startswith("application/problem+json"), resp.headers
    problem = resp.json()
    assert problem["status"] == resp.status_code and problem["detail"]
    logged = world.server.wait_logged(rid, offset)
    assert snapshot(world.db) == before, "a refused request changed the database"
    assert_clean_log(logged, world.secrets, markers)
    assert len(logged.encode()) <= LOG_BYTES_PER_REQUEST, f"{len(logged)} bytes of log for one request"
    return resp


def _blob(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


# --- 2. ids that str.isdigit() accepts and int() does not ----------------------------------------


@pytest.mark.parametrize(
    ("method", "template", "who", "expect"),
    [
        ("GET", "/api/v1/federations/%C2%B2", None, 401),  # no credential at all: was a 500
        ("GET", "/api/v1/federations/%C2%B2", "admin", 422),
        ("GET", "/api/v1/federations/%D9%A1%D9%A2", "admin", 422),  # Arabic-Indic digits
        ("GET", "/api/v1/federations/%C2%B2/clients", "admin", 422),
        ("GET", "/api/v1/federations/{fid}/rounds/%C2%B2", "admin", 422),
        ("DELETE", "/api/v1/federations/{fid}/clients/%C2%B2", "admin", 422),
        ("PUT", "/api/v1/federations/{fid}/rounds/%C2%B2/update", "client", 422),
        ("GET", "/api/v1/federations/{fid}/prompts/%C2%B2", "client", 422),
        ("GET", "/api/v1/federations/{fid}/export?version=%C2%B2", "admin", 422),
        ("GET", "/api/v1/federations/99999999999999999999999999", "admin", 422),
        ("GET", "/api/v1/federations/{fid}.0", "admin", 422),  # was read as the id itself
        ("GET", "/api/v1/federations/+{fid}", "admin", 422),
        ("GET", "/api/v1/federations/%20{fid}", "admin", 422),
        ("GET", "/api/v1/federations/{fid}/rounds/1.0", "admin", 422),
        ("GET", "/api/v1/federations/{fid}/rounds/1_0", "admin", 422),
    ],
)
def test_path_ids_are_parsed_strictly(
    world: World, method: str, template: str, who: str | None, expect: int
) -> None:
    headers = {"admin": ADMIN_H, "client": world.client_h(), None: {}}[who]
    hostile(world, method, template.format(fid=world.fid), expect=expect, headers=headers)


# --- 2. JSON the server parses: nesting and number size -----------------------------------------


def test_a_safetensors_header_nested_100000_deep_is_422(world: World) -> None:
    header = b'{"__metadata__": {"format": "fedprompt/1"}, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = f"/api/v1/federations/{world.fid}/rounds/1/update"
    resp = hostile(
        world, "PUT", path, expect=422, headers=world.client_h(), content=_blob(header), markers=("[" * 40,)
    )
    assert "nested" in resp.json()["detail"]


def test_a_tensor_named_twice_in_a_safetensors_header_is_422(world: World) -> None:
    """Two header entries for one tensor name: which one a reader takes is up to the reader."""
    header = (
        b'{"__metadata__": {"format": "fedprompt/1"},'
        b' "prompt": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
        b' "prompt": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    )
    path = f"/api/v1/federations/{world.fid}/rounds/1/update"
    resp = hostile(
        world, "PUT", path, expect=422, headers=world.client_h(), content=_blob(header, bytes(8)), markers=()
    )
    assert "more than once" in resp.json()["detail"]


def test_metrics_with_a_5000_digit_number_is_422(world: World) -> None:
    body = wire.encode(
        random_tensors(SMALL_SPEC, 1),
        {"num_samples": "10", "method": "prompt_tuning", "metrics": '{"loss": 1' + "0" * 5000 + "}"},
    )
    path = f"/api/v1/federations/{world.fid}/rounds/1/update"
    resp = hostile(
        world, "PUT", path, expect=422, headers=world.client_h(), content=body, markers=("0" * 64,)
    )
    assert "metrics" in resp.json()["detail"]


@pytest.mark.parametrize(
    ("body", "marker"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "[" * 40),
        (b'{"name": "x", "rounds": ' + b"9" * 5000 + b"}", "9" * 64),
        (b'{"name": "x", "lr": 1e999}', "1e999"),
        (b'{"name": "\\ud800"}', "ud800"),
        (b'{"name": "x", "rounds": 3, "rounds": 300000}', "300000"),
    ],
)
def test_json_bodies_past_the_limits_are_400(world: World, body: bytes, marker: str) -> None:
    headers = {**ADMIN_H, "Content-Type": "application/json"}
    hostile(
        world, "POST", "/api/v1/federations", expect=400, headers=headers, content=body, markers=(marker,)
    )


def test_a_deep_info_object_at_enrolment_is_400(world: World) -> None:
    body = b'{"name": "deep", "num_samples": 1, "info": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}"
    headers = {"Authorization": f"Bearer {world.enrolment}", "Content-Type": "application/json"}
    hostile(
        world, "POST", f"/api/v1/federations/{world.fid}/clients", expect=400, headers=headers, content=body
    )


# --- 2. NUL and control characters in names --------------------------------------------------------


@pytest.mark.parametrize("name", ["nul\x00name", "new\nline", "esc\x1b[31m", "c1\x85"])
def test_control_characters_in_a_federation_name_are_422(world: World, name: str) -> None:
    hostile(
        world, "POST", "/api/v1/federations", expect=422, headers=ADMIN_H, json={**SMALL_SPEC, "name": name}
    )


@pytest.mark.parametrize("name", ["nul\x00name", "tab\tname", "del\x7f"])
def test_control_characters_in_a_client_name_are_422(world: World, name: str) -> None:
    headers = {"Authorization": f"Bearer {world.enrolment}"}
    hostile(
        world,
        "POST",
        f"/api/v1/federations/{world.fid}/clients",
        expect=422,
        headers=headers,
        json={"name": name, "num_samples": 3},
    )


# --- 4. schemas: what is declared is what is accepted -----------------------------------------------


@pytest.mark.parametrize(
    "body",
    [{"expires_in_s": True}, {"max_uses": True}, {"max_uses": "3"}, {"expires_in_s": "60"}, {"extra": 1}],
)
def test_enrolment_token_options_are_strict(world: World, body: dict[str, Any]) -> None:
    hostile(
        world,
        "POST",
        f"/api/v1/federations/{world.fid}/enrollment-tokens",
        expect=422,
        headers=ADMIN_H,
        json=body,
    )


@pytest.mark.parametrize("patch", [{"rounds": True}, {"rounds": "3"}, {"auto_advance": 1}, {"unknown": 1}])
def test_a_spec_is_strict_and_closed(world: World, patch: dict[str, Any]) -> None:
    hostile(world, "POST", "/api/v1/federations", expect=422, headers=ADMIN_H, json={**SMALL_SPEC, **patch})


def test_an_evaluation_report_is_strict(world: World) -> None:
    path = f"/api/v1/federations/{world.fid}/rounds/0/evaluation"
    body = {"num_samples": True, "accuracy": 0.5}
    hostile(world, "POST", path, expect=422, headers=world.client_h(2), json=body)


@pytest.mark.parametrize("query", ["format=zip", "format=", "version=-1", "version=latest%00", "version=1.5"])
def test_export_parameters_are_an_enum_and_a_pattern(world: World, query: str) -> None:
    hostile(world, "GET", f"/api/v1/federations/{world.fid}/export?{query}", expect=422, headers=ADMIN_H)


# --- 1. bodies and tokens never reach the log --------------------------------------------------------


def test_a_login_form_with_the_admin_token_is_not_logged(world: World) -> None:
    offset = world.server.log_size()
    rid = request_id()
    resp = httpx.post(
        world.url + "/dashboard/login",
        content=f"token={ADMIN}".encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "X-Request-ID": rid},
    )
    assert resp.status_code == 303 and "fedprompt_session" in resp.headers["set-cookie"]
    cookie = resp.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    logged = world.server.wait_logged(rid, offset)
    assert_clean_log(logged, [*world.secrets, cookie])


def _raw(world: World, head: bytes, body: bytes) -> None:
    """Send a request head and part of its body on a raw connection, then hang up."""
    with socket.create_connection(("127.0.0.1", world.server.port), timeout=10) as sock:
        sock.sendall(head + body)


@pytest.mark.parametrize("route", ["login", "upload"])
def test_a_client_that_hangs_up_mid_body_leaves_no_trace_and_no_secret(world: World, route: str) -> None:
    before = snapshot(world.db)
    offset = world.server.log_size()
    rid = request_id()
    if route == "login":
        body = f"token={ADMIN}".encode()
        head = (
            f"POST /dashboard/login HTTP/1.1\r\nHost: x\r\nX-Request-ID: {rid}\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body) + 100}\r\n\r\n"
        )
    else:
        body = wire.encode(random_tensors(SMALL_SPEC, 2), {"num_samples": "10"})
        head = (
            f"PUT /api/v1/federations/{world.fid}/rounds/1/update HTTP/1.1\r\nHost: x\r\nX-Request-ID: {rid}\r\n"
            f"Authorization: Bearer {world.clients[1]['token']}\r\nContent-Length: {len(body) + 100}\r\n\r\n"
        )
    for _ in range(20):  # 200 of these added 36 MB of log and stalled /healthz for 9.6 s
        _raw(world, head.encode(), body)
    assert httpx.get(world.url + "/healthz").elapsed.total_seconds() < 1.0
    deadline = time.monotonic() + 10
    while world.server.log_since(offset).count('"event": "request"') < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    logged = world.server.log_since(offset)
    assert snapshot(world.db) == before
    assert_clean_log(logged, world.secrets)
    assert len(logged.encode()) <= 20 * LOG_BYTES_PER_REQUEST
    statuses = {json.loads(x).get("status") for x in logged.splitlines() if '"event": "request"' in x}
    assert statuses <= {400, 429}, statuses  # 429: past the per-client uploads in progress
