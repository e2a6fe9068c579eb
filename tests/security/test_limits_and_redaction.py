"""The pure parts of the hardening: bounded JSON, log redaction, the repeat limiter, strict path ids."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest
import structlog
from fedprompt.shared import jsonlimits, wire
from fedprompt.shared.logs import (
    MAX_EVENT_CHARS,
    REDACTED,
    RepeatLimiter,
    configure_logging,
    path_fields,
    redact_text,
    redact_value,
)

ADMIN = "an-admin-token-of-no-particular-shape"
CLIENT = "fpc_" + "A" * 43
ENROL = "fpe_" + "b" * 43


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    structlog.reset_defaults()


# --- bounded JSON ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested 100000 levels"),
        (b"{" * 100_000, "nested"),
        (b'{"a": ' + b"9" * 5000 + b"}", "number of 5000 characters"),
        (b'{"a": 1e999}', "too large"),
        (b'{"a": -Infinity}', "not a JSON number"),
        (b'{"a": NaN}', "not a JSON number"),
        (b'{"a": "\\ud800"}', "surrogate"),
        (b'{"a": ', "not valid JSON"),
        (b'{"a": 1, "b": {"c": 2, "c": 3}}', "key 'c' more than once"),
        (b'{"round": 1, "round": 2}', "key 'round' more than once"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_hostile_json_is_one_limit_error(doc: bytes, says: str) -> None:
    start = time.process_time()  # CPU time: a loaded machine must not fail it
    with pytest.raises(jsonlimits.JSONLimitError, match=says):
        jsonlimits.loads(doc)
    assert time.process_time() - start < 0.5


def test_ordinary_json_and_brackets_inside_strings() -> None:
    doc = {"a": [1, 2.5, {"b": '[[[[{{{{\\"', "c": "😀"}], "n": -3, "big": 1.7976931348623157e308}
    assert jsonlimits.loads(json.dumps(doc)) == doc
    assert jsonlimits.loads(json.dumps({"s": "[" * 1000})) == {"s": "[" * 1000}  # strings are not depth
    assert jsonlimits.nesting_depth(b'[[1,[2]],{"a":"[[[[\\"["}]') == 3
    assert jsonlimits.loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(jsonlimits.JSONLimitError):
        jsonlimits.loads(b"[" * 65 + b"]" * 65)


def test_quadratic_escapes_are_linear() -> None:
    # this process's CPU time, not the wall clock: a loaded machine must not fail it (a quadratic
    # scan of these 300,000 escapes would take minutes of CPU, a linear one milliseconds)
    start = time.process_time()
    assert jsonlimits.nesting_depth(b'"\\"' * 300_000 + b"[[") >= 0
    assert time.process_time() - start < 1.0


def _header_blob(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize(
    "header",
    [
        b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"__metadata__": {"a": ' + b"1" * 5000 + b"}}",
        b'{"__metadata__": {"a": "\\udc00"}}',
        # one tensor name twice: readers disagree on which entry is the tensor
        b'{"p": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
        b' "p": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
    ],
)
def test_a_hostile_safetensors_header_is_a_wire_error(header: bytes) -> None:
    with pytest.raises(wire.WireError, match="not a safetensors file"):
        wire.read_metadata(_header_blob(header))


# --- redaction -------------------------------------------------------------------------------------


def test_token_shapes_and_registered_secrets_are_redacted(restore_logging: None) -> None:
    configure_logging("info", "json", stream=io.StringIO(), secrets=[ADMIN])
    text = f"Authorization: Bearer {ADMIN} then {CLIENT}, and {ENROL}; basic dXNlcjpwYXNz"
    out = redact_text(text)
    for secret in (ADMIN, CLIENT, ENROL, "dXNlcjpwYXNz"):
        assert secret not in out
    assert out.count(REDACTED) >= 4


def test_fields_named_like_secrets_are_dropped_whatever_their_value() -> None:
    event = {
        "authorization": "x",
        "Cookie": "fedprompt_session=v1.1.2",
        "headers": [("a", "b")],
        "body": b"token=" + ADMIN.encode(),
        "request_body": "{}",
        "admin_token": "y",
        "password": "z",
        "num_virtual_tokens": 20,
        "blob": b"\x00" * 100,
        "nested": {"x-api-key": "k", "fine": [1, 2, 3]},
    }
    out = redact_value(event)
    for key in ("authorization", "Cookie", "headers", "body", "request_body", "admin_token", "password"):
        assert out[key] == REDACTED
    assert out["num_virtual_tokens"] == 20 and out["blob"] == "[100 bytes]"
    assert out["nested"] == {"x-api-key": REDACTED, "fine": [1, 2, 3]}


def test_a_trace_has_no_locals_and_a_bounded_size(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream, secrets=[ADMIN])

    def deep(n: int, authorization: str, body: bytes) -> None:
        if n:
            deep(n - 1, authorization, body)
        raise ValueError(f"failed for {authorization} " + "x" * 100_000)

    try:
        deep(200, f"Bearer {ADMIN}", b"token=" + CLIENT.encode() + b"." * 1_000_000)
    except ValueError:
        logging.getLogger("fedprompt.test").exception("boom")
    line = stream.getvalue().strip()
    assert len(line) < MAX_EVENT_CHARS + 2000
    assert ADMIN not in line and CLIENT not in line and '"locals"' not in line
    record = json.loads(line)
    assert record["event"] == "boom" and "ValueError" in line


def test_console_traces_are_plain_and_redacted(restore_logging: None) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    configure_logging("info", "console", stream=stream, secrets=[ADMIN])
    try:
        token = CLIENT  # a local the console's rich traces would have shown
        raise RuntimeError(f"with {ADMIN} and {token}")
    except RuntimeError:
        logging.getLogger("fedprompt.test").exception("boom")
    text = stream.getvalue()
    assert "RuntimeError" in text and ADMIN not in text and CLIENT not in text


def test_a_repeated_error_is_written_once_per_window(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    log = logging.getLogger("fedprompt.test")
    for _ in range(50):
        try:
            int("x")
        except ValueError:
            log.exception("same failure")
    log.warning("another warning")
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["same failure", "another warning"]


def test_repeat_limiter_counts_what_it_left_out() -> None:
    now = [0.0]
    limiter = RepeatLimiter(window_s=10, burst=2, max_kinds=3, clock=lambda: now[0])
    assert [limiter.admit("a") for _ in range(5)] == [
        (True, 0),
        (True, 0),
        (False, 0),
        (False, 0),
        (False, 0),
    ]
    now[0] = 10.0
    assert limiter.admit("a") == (True, 3)
    for kind in "bcde":  # old kinds are forgotten past max_kinds
        limiter.admit(kind)
    assert len(limiter._kinds) == 3


def test_path_ids_are_parsed_strictly() -> None:
    assert path_fields({"fid": "3", "number": "12", "cid": "7"}) == {
        "federation_id": 3,
        "round": 12,
        "client_id": 7,
    }
    assert path_fields({"fid": "²"}) == {"federation_id": "²"}
    assert path_fields({"fid": "١٢"}) == {"federation_id": "١٢"}
    assert path_fields({"fid": "9" * 5000})["federation_id"] == "9" * 64
    assert path_fields({"fid": ENROL}) == {"federation_id": REDACTED}


def test_only_identical_repeats_are_left_out(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    log = logging.getLogger("fedprompt.test")
    for fid in (1, 2, 1, 2):
        log.warning("reading federation %s failed", fid)
    slog = structlog.get_logger("fedprompt.test")
    for round_number in (3, 4, 3):
        slog.warning("round_failed", round=round_number)
    events = [(x["event"], x.get("round")) for x in map(json.loads, stream.getvalue().splitlines())]
    assert events == [
        ("reading federation 1 failed", None),
        ("reading federation 2 failed", None),
        ("round_failed", 3),
        ("round_failed", 4),
    ]
