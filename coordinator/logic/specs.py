"""Federation specs as the API receives them: parsed strictly, refused with one readable 422. No I/O."""

from __future__ import annotations

from typing import Any

from fedprompt.coordinator.errors import Invalid
from fedprompt.coordinator.logic.aggregation import AggregationError, check_params
from fedprompt.shared.spec import FederationSpec
from pydantic import ValidationError


def validate_spec(payload: Any) -> FederationSpec:
    """Parse a federation spec, turning validation errors into one readable 422.

    Strict, as its JSON schema says: a number is not taken from a string, nor an integer or a
    boolean from each other (``"rounds": true`` is refused, not read as 1)."""
    try:
        return FederationSpec.model_validate(payload, strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        raise Invalid(f"invalid federation spec: {problems}") from None


def check_aggregation(spec: FederationSpec) -> None:
    """The aggregation rule's parameters, checked before a federation is created (422 if wrong)."""
    try:
        check_params(spec.aggregation.name, spec.aggregation.params)
    except AggregationError as exc:
        raise Invalid(f"invalid federation spec: aggregation: {exc}", field="aggregation") from None
