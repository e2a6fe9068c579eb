"""Property-based tests (hypothesis) of the validators that guard the API's inputs.

`validate_spec` (POST /api/v1/federations) and `parse_update_metadata` (the safetensors header of
every upload) see whatever a caller sends: for any input they return a checked value or raise
`Invalid` (a 422 with a message), never anything else (which would be a 500); what they accept
comes back unchanged.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fedprompt.coordinator.errors import Invalid
from fedprompt.coordinator.logic.specs import validate_spec
from fedprompt.coordinator.logic.uploads import parse_update_metadata
from fedprompt.coordinator.persistence.db import MAX_ID
from fedprompt.shared import wire
from fedprompt.shared.spec import FederationSpec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPEC = FederationSpec(num_virtual_tokens=4, hidden_size=8, model_fingerprint="abc123")
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
number_texts = st.one_of(
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
    st.integers(min_value=0, max_value=10**400).map(str),
    st.sampled_from(["", " 7 ", "1e3", "0x10", "NaN", "inf", "٣", "1_000", "+5", "-0", "9" * 5000]),
    st.text(max_size=12),
)
metrics_texts = st.one_of(
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.dictionaries(st.text(max_size=8), scalars, max_size=4).map(lambda v: json.dumps(v, allow_nan=True)),
    st.sampled_from(['{"a": 1e999}', '{"a": NaN}', '{"a": true}', '{"a": ' + "1" * 400 + "}"]),
    st.integers(1, 100_000).map(lambda depth: "[" * depth + "]" * depth),
    st.text(max_size=30),
)


@st.composite
def metadata(draw: st.DrawFn) -> dict[str, str]:
    """Mostly headers that pass the first checks, so the later ones (metrics) are reached too."""
    meta: dict[str, str] = {}
    well_formed = draw(st.integers(0, 3)) > 0
    if well_formed or draw(st.booleans()):
        meta["format"] = (
            wire.FORMAT if well_formed else draw(st.sampled_from(["pt", ""]) | st.text(max_size=8))
        )
    if well_formed:
        meta["num_samples"] = str(draw(st.integers(1, MAX_ID)))
    elif draw(st.booleans()):
        meta["num_samples"] = draw(number_texts)
    if draw(st.integers(0, 3)) > 0:
        meta["metrics"] = draw(metrics_texts)
    if draw(st.booleans()):
        meta["method"] = draw(
            st.sampled_from(["prompt_tuning", "p_tuning", "prefix_tuning"]) | st.text(max_size=8)
        )
    if draw(st.booleans()):
        meta["model_fingerprint"] = draw(st.sampled_from(["abc123", "other"]) | st.text(max_size=8))
    meta.update(draw(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)))
    return meta


@SETTINGS
@given(meta=metadata())
def test_any_metadata_is_accepted_checked_or_refused_with_invalid(meta: dict[str, str]) -> None:
    try:
        num_samples, metrics = parse_update_metadata(meta, SPEC)
    except Invalid as exc:
        assert exc.status == 422 and exc.detail
        return
    assert meta["format"] == wire.FORMAT
    assert isinstance(num_samples, int) and 1 <= num_samples <= MAX_ID
    assert isinstance(metrics, dict)
    for value in metrics.values():
        assert isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    json.dumps(metrics, allow_nan=False)  # what is stored can be served back as strict JSON


finite_metrics = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**15), 10**15),
    max_size=5,
)


@SETTINGS
@given(num_samples=st.integers(1, MAX_ID), metrics=finite_metrics, with_fingerprint=st.booleans())
def test_valid_metadata_comes_back_unchanged(
    num_samples: int, metrics: dict[str, Any], with_fingerprint: bool
) -> None:
    meta = {"format": wire.FORMAT, "num_samples": str(num_samples), "method": "prompt_tuning"}
    if metrics:
        meta["metrics"] = json.dumps(metrics)
    if with_fingerprint:
        meta["model_fingerprint"] = "abc123"
    assert parse_update_metadata(meta, SPEC) == (num_samples, metrics)


@SETTINGS
@given(num_samples=st.integers(max_value=0) | st.integers(min_value=MAX_ID + 1))
def test_sample_counts_outside_the_32_bit_range_are_refused(num_samples: int) -> None:
    meta = {"format": wire.FORMAT, "num_samples": str(num_samples)}
    try:
        parse_update_metadata(meta, SPEC)
    except Invalid as exc:
        assert "num_samples" in exc.detail
    else:
        raise AssertionError(f"num_samples={num_samples} was accepted")


# -- validate_spec ------------------------------------------------------------------------------

BASE = {"name": "p", "num_virtual_tokens": 4, "hidden_size": 8, "rounds": 2, "min_clients": 1}
FIELDS = sorted(FederationSpec.model_fields)


@st.composite
def perturbed_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec with some fields replaced by arbitrary JSON values (or dropped, or added)."""
    spec: dict[str, Any] = dict(BASE)
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=4, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            spec.pop(field, None)
        else:
            spec[field] = draw(json_values)
    if draw(st.booleans()):
        spec[draw(st.text(max_size=10))] = draw(json_values)
    return spec


def _accepted_or_invalid(payload: Any) -> FederationSpec | None:
    try:
        return validate_spec(payload)
    except Invalid as exc:
        assert exc.status == 422 and exc.detail.startswith("invalid federation spec: ")
        return None


@SETTINGS
@given(payload=json_values)
def test_any_json_is_a_spec_or_a_readable_422(payload: Any) -> None:
    _accepted_or_invalid(payload)


@SETTINGS
@given(payload=perturbed_specs())
def test_a_perturbed_spec_is_a_spec_or_a_readable_422(payload: dict[str, Any]) -> None:
    spec = _accepted_or_invalid(payload)
    if spec is not None:
        # What is accepted is stored as its dump: it must validate again to the same spec, and be
        # strict JSON (the database and every answer serialise it).
        dumped = json.loads(json.dumps(spec.model_dump(mode="json"), allow_nan=False))
        assert validate_spec(dumped) == spec
        assert spec.prompt_bytes() > 0


@SETTINGS
@given(
    tokens=st.integers(1, 1024),
    hidden=st.integers(1, 4096),
    rounds=st.integers(1, 100_000),
    fraction=st.floats(min_value=0, max_value=1, exclude_min=True),
    lr=st.floats(min_value=0, max_value=100, exclude_min=True),
)
def test_specs_within_the_documented_ranges_are_accepted(
    tokens: int, hidden: int, rounds: int, fraction: float, lr: float
) -> None:
    payload = {**BASE, "num_virtual_tokens": tokens, "hidden_size": hidden, "rounds": rounds}
    spec = validate_spec({**payload, "fraction": fraction, "lr": lr})
    assert (spec.num_virtual_tokens, spec.hidden_size, spec.rounds) == (tokens, hidden, rounds)
    assert spec.fraction == fraction and spec.lr == lr
