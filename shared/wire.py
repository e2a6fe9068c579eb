"""The wire format: a prompt travels as a safetensors file with string metadata.

numpy only, so the coordinator never needs torch. Every check raises ``WireError`` with a
message that says what was expected and what arrived.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from fedprompt.shared import jsonlimits
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

FORMAT = "fedprompt/1"
WIRE_DTYPE = np.dtype("float32")
_MAX_HEADER = 1 << 20


class WireError(ValueError):
    """A blob is not a valid prompt for the federation it was sent to."""


def sha256(data: bytes) -> str:
    """Hex sha256 of a blob (the ETag and integrity check of every prompt)."""
    return hashlib.sha256(data).hexdigest()


def encode(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any] | None = None) -> bytes:
    """Serialise named float32 tensors plus metadata (values become strings) to safetensors bytes."""
    if "__metadata__" in tensors:
        raise WireError("'__metadata__' is reserved by safetensors and cannot name a tensor")
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        meta[key] = value if isinstance(value, str) else json.dumps(value)
    meta["format"] = FORMAT  # always ours: receivers check it
    arrays = {name: np.ascontiguousarray(arr, dtype=WIRE_DTYPE) for name, arr in tensors.items()}
    return _st_save(arrays, metadata=meta)


def read_metadata(data: bytes) -> dict[str, str]:
    """Parse the safetensors header and return its ``__metadata__`` without loading tensors."""
    if len(data) < 8:
        raise WireError(f"body is {len(data)} bytes; a safetensors file starts with an 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _MAX_HEADER or 8 + header_len > len(data):
        raise WireError("body is not a safetensors file (header length is larger than the body; truncated?)")
    try:  # bounded: nesting depth, number length (a header nested 100,000 deep is refused, not recursed)
        header = jsonlimits.loads(data[8 : 8 + header_len], what="the safetensors header")
    except jsonlimits.JSONLimitError as exc:
        raise WireError(f"body is not a safetensors file ({exc})") from None
    if not isinstance(header, dict):
        raise WireError("body is not a safetensors file (header is not a JSON object)")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise WireError("safetensors __metadata__ must be an object of strings")
    return {str(k): str(v) for k, v in meta.items()}


def decode(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Parse safetensors bytes into (tensors, metadata); never unpickles anything."""
    meta = read_metadata(data)
    try:
        tensors = _st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise WireError(f"body is not a valid safetensors file: {exc}") from None
    return tensors, meta


def validate(tensors: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]]) -> None:
    """Check names, shapes, dtype (float32) and finiteness against the federation's spec."""
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unexpected {extra}")
        raise WireError(
            f"tensor names do not match the federation ({'; '.join(parts)}); expected {sorted(expected)}"
        )
    for name, shape in expected.items():
        arr = tensors[name]
        if arr.dtype != WIRE_DTYPE:
            raise WireError(f"tensor '{name}' has dtype {arr.dtype}; the federation uses float32")
        if tuple(arr.shape) != tuple(shape):
            raise WireError(
                f"tensor '{name}' has shape {list(arr.shape)}; the federation expects {list(shape)}"
            )
        if not np.isfinite(arr).all():
            raise WireError(f"tensor '{name}' contains NaN or Inf values")


def decode_checked(
    data: bytes, expected: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Decode and validate in one step."""
    tensors, meta = decode(data)
    validate(tensors, expected)
    return tensors, meta
