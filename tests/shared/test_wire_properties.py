"""Property-based tests of the wire format: exact round trips, and every corruption refused cleanly."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from fedprompt.shared import wire
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

shapes = st.tuples(st.integers(1, 6), st.integers(1, 6))
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
    lambda n: n != "__metadata__"
)


@st.composite
def prompts(draw: st.DrawFn) -> dict[str, np.ndarray]:
    keys = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    return {k: draw(arrays(np.float32, draw(shapes), elements=finite)) for k in keys}


@settings(max_examples=150, deadline=None)
@given(tensors=prompts(), meta=st.dictionaries(names, st.text(max_size=20), max_size=4))
def test_round_trip_is_exact(tensors: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    blob = wire.encode(tensors, meta)
    back, got_meta = wire.decode_checked(blob, {k: v.shape for k, v in tensors.items()})
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == np.float32
        np.testing.assert_array_equal(back[k], v)
    assert got_meta["format"] == wire.FORMAT
    assert all(got_meta[k] == v for k, v in meta.items() if k != "format")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors=prompts(), cut=st.integers(0, 10_000), data=st.data())
def test_truncated_or_corrupted_bodies_raise_wire_error_only(
    tensors: dict[str, np.ndarray], cut: int, data: st.DataObject
) -> None:
    blob = wire.encode(tensors, {"num_samples": "3"})
    expected = {k: v.shape for k, v in tensors.items()}
    truncated = blob[: cut % len(blob)]
    with pytest.raises(wire.WireError):
        wire.decode_checked(truncated, expected)
    # Flip one byte anywhere: either still a valid prompt (a value byte) or a WireError, never another exception.
    pos = data.draw(st.integers(0, len(blob) - 1))
    flipped = bytearray(blob)
    flipped[pos] ^= 0xFF
    with contextlib.suppress(wire.WireError):
        wire.decode_checked(bytes(flipped), expected)


@settings(max_examples=100, deadline=None)
@given(junk=st.binary(max_size=512))
def test_arbitrary_bytes_never_crash_the_decoder(junk: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.decode_checked(junk, {"prompt_embeddings": (2, 2)})


@settings(max_examples=100, deadline=None)
@given(tensors=prompts(), data=st.data())
def test_validator_refuses_any_wrong_shape(tensors: dict[str, np.ndarray], data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(tensors)))
    expected = {k: v.shape for k, v in tensors.items()}
    expected[name] = (expected[name][0] + data.draw(st.integers(1, 3)), expected[name][1])
    with pytest.raises(wire.WireError, match="shape"):
        wire.validate(tensors, expected)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, data=st.data())
def test_validator_refuses_non_finite_values(shape: tuple[int, int], data: st.DataObject) -> None:
    arr = np.zeros(shape, np.float32)
    arr[data.draw(st.integers(0, shape[0] - 1)), data.draw(st.integers(0, shape[1] - 1))] = data.draw(
        st.sampled_from([np.nan, np.inf, -np.inf])
    )
    with pytest.raises(wire.WireError, match="NaN or Inf"):
        wire.validate({"p": arr}, {"p": shape})


def test_reserved_tensor_name_is_refused_when_encoding() -> None:
    with pytest.raises(wire.WireError, match="reserved"):
        wire.encode({"__metadata__": np.zeros((1, 1), np.float32)})
