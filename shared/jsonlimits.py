"""JSON parsing with limits: nesting depth, the length of a number, finite numbers, valid text.

Every JSON document the coordinator parses from a request (request bodies, a safetensors header,
an update's ``metrics`` metadata) goes through ``loads``: the standard library's parser recurses
once per level of nesting (a document nested 100,000 deep raises ``RecursionError``), turns a
5,000-digit integer into ``ValueError`` and ``1e999`` into ``inf``, and keeps a lone surrogate
(``"\\ud800"``) that no database or UTF-8 response can hold. Here each of those is one
``JSONLimitError`` (a ``ValueError``) with a message that says which limit was passed.
Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

# Far deeper than any document of this API (a safetensors header is 3 levels, a spec 4).
MAX_DEPTH = 64
# Characters of one number: a float written out in full has at most 309 digits before its point.
MAX_NUMBER_CHARS = 400

_ESCAPE = re.compile(rb"\\.", re.S)
_STRING = re.compile(rb'"[^"]*"')
_OPEN = np.array([ord("["), ord("{")], dtype=np.uint8)
_CLOSE = np.array([ord("]"), ord("}")], dtype=np.uint8)


class JSONLimitError(ValueError):
    """A JSON document is invalid or passes one of the limits."""


class JSONSyntaxError(JSONLimitError):
    """A document that is not JSON at all; ``decode_error`` is the parser's own error."""

    def __init__(self, message: str, decode_error: json.JSONDecodeError) -> None:
        super().__init__(message)
        self.decode_error = decode_error


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON document, in linear time.

    Escapes are dropped first, then strings, so brackets inside strings do not count; what is left
    is summed (+1 for ``[`` ``{``, -1 for ``]`` ``}``). Exact for valid JSON; for invalid JSON it is
    only an estimate, and the parser refuses that document anyway."""
    bare = _STRING.sub(b"", _ESCAPE.sub(b"", data))
    arr = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(arr, _OPEN).astype(np.int32) - np.isin(arr, _CLOSE).astype(np.int32)
    return int(np.cumsum(steps).max(initial=0))


def loads(
    data: bytes | bytearray | str,
    *,
    what: str = "JSON",
    max_depth: int = MAX_DEPTH,
    max_number_chars: int = MAX_NUMBER_CHARS,
    integral_floats_as_int: bool = False,
) -> Any:
    """Parse JSON within the limits, or raise JSONLimitError naming `what` was refused and why.

    `integral_floats_as_int`: read ``5.0`` (or ``5e0``) as the integer 5, as JSON Schema does (its
    ``integer`` is any number without a fraction), so that a strict model takes it where it takes 5
    (exactly representable values only: at most 2**53)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") > max_depth:  # cheap test first: few brackets, no deep nesting
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise JSONLimitError(f"{what} is nested {depth} levels deep; at most {max_depth} are accepted")

    def number(kind: type) -> Any:
        def parse(token: str) -> Any:
            if len(token) > max_number_chars:
                raise JSONLimitError(
                    f"{what} has a number of {len(token)} characters; at most {max_number_chars} are accepted"
                )
            value = kind(token)
            if kind is float and not math.isfinite(value):
                raise JSONLimitError(f"{what} has a number too large for a 64-bit float ({token[:20]}…)")
            if integral_floats_as_int and kind is float and value.is_integer() and abs(value) <= 2**53:
                return int(value)
            return value

        return parse

    def constant(token: str) -> Any:
        raise JSONLimitError(f"{what} has {token}, which is not a JSON number")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs):  # parsers disagree on which of two equal keys wins: refuse both
            seen: set[str] = set()
            for twice, _ in pairs:  # the first key that comes a second time
                if twice in seen:
                    break
                seen.add(twice)
            raise JSONLimitError(
                f"{what} has the key {twice[:64]!r} more than once; each key may appear once"
            )
        return obj

    try:
        value = json.loads(
            raw,
            parse_int=number(int),
            parse_float=number(float),
            parse_constant=constant,
            object_pairs_hook=unique_keys,
        )
    except JSONLimitError:
        raise
    except json.JSONDecodeError as exc:
        raise JSONSyntaxError(f"{what} is not valid JSON: {exc}", exc) from None
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:  # belt and braces
        raise JSONLimitError(f"{what} is not valid JSON: {type(exc).__name__}") from None
    if b"\\u" in raw or b"\\U" in raw:  # only an escape can make a lone surrogate out of UTF-8 input
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise JSONLimitError(f"{what} has a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return value
