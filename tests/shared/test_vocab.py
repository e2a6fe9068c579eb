"""The vocabulary (shared/vocab.py) in the spec: each set of names is its enum's, the spec's JSON schema
lists the same values as before, and names are taken from their text under the API's strict validation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import DriftCorrectionSpec, ServerOptimizerSpec, check_secure_aggregation
from fedprompt.shared.vocab import (
    DriftCorrection,
    EncoderType,
    Family,
    Method,
    RoundState,
    Scoring,
    ServerOptimizer,
    choices,
)
from pydantic import ValidationError

BASE = {"name": "p", "num_virtual_tokens": 4, "hidden_size": 8, "rounds": 2, "min_clients": 1}


def _allowed(schema: dict[str, Any], prop: dict[str, Any]) -> list[str]:
    """The values a property's schema allows, through its $ref."""
    if "$ref" in prop:
        prop = schema["$defs"][prop["$ref"].rsplit("/", 1)[-1]]
    return prop["enum"]


# the values the spec's Literal fields listed before the vocabulary
BEFORE = {
    "family": ["masked_lm", "causal_lm", "seq2seq"],
    "method": ["prompt_tuning", "p_tuning", "prefix_tuning"],
    "encoder_type": ["mlp", "lstm"],
    "scoring": ["auto", "tied-embeddings", "mean-pool"],
}


@pytest.mark.parametrize(("field", "enum"), [("family", Family), ("method", Method), ("encoder_type", EncoderType), ("scoring", Scoring)])  # fmt: skip
def test_the_specs_schema_lists_the_same_values_as_the_vocabulary(field: str, enum: type) -> None:
    schema = FederationSpec.model_json_schema()
    assert _allowed(schema, schema["properties"][field]) == BEFORE[field] == [m.value for m in enum]


def test_nested_specs_list_the_optimisers_and_drift_corrections() -> None:
    schema = ServerOptimizerSpec.model_json_schema()
    names = ["fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"]
    assert _allowed(schema, schema["properties"]["name"]) == names == [m.value for m in ServerOptimizer]
    schema = DriftCorrectionSpec.model_json_schema()
    drift = ["none", "fedprox", "scaffold"]
    assert _allowed(schema, schema["properties"]["name"]) == drift == [m.value for m in DriftCorrection]


def test_names_are_taken_from_their_text_under_strict_validation() -> None:
    spec = FederationSpec.model_validate(
        {
            **BASE,
            "family": "causal_lm",
            "scoring": "mean-pool",
            "server_optimizer": {"name": "fedavgm"},
            "drift_correction": {"name": "fedprox"},
        },
        strict=True,
    )
    assert spec.family is Family.CAUSAL_LM and spec.scoring is Scoring.MEAN_POOL
    assert spec.server_optimizer is not None and spec.server_optimizer.name is ServerOptimizer.FEDAVGM
    assert spec.drift_correction is not None and spec.drift_correction.name is DriftCorrection.FEDPROX
    assert spec.method is Method.PROMPT_TUNING  # a default is the member too
    dumped = spec.model_dump(mode="json")
    assert dumped["family"] == "causal_lm" and type(dumped["family"]) is str
    # a dump in Python mode (members) validates again, strictly, and writes the same JSON
    again = FederationSpec.model_validate(spec.model_dump(), strict=True)
    assert json.dumps(again.model_dump(), sort_keys=True) == json.dumps(dumped, sort_keys=True)


@pytest.mark.parametrize("value", ["bogus", 1, None, True])
def test_an_unknown_name_is_refused_naming_the_choices(value: Any) -> None:
    with pytest.raises(ValidationError) as exc:
        FederationSpec.model_validate({**BASE, "family": value}, strict=True)
    (error,) = exc.value.errors()
    assert error["loc"] == ("family",)
    assert error["msg"] == "Input should be 'masked_lm', 'causal_lm' or 'seq2seq'"
    with pytest.raises(ValidationError, match=r"Input should be 'fedavg', 'fedavgm', 'fedadagrad', 'fedadam' or 'fedyogi'"):  # fmt: skip
        ServerOptimizerSpec.model_validate({"name": "sgd"})


def test_a_member_is_its_text() -> None:
    assert RoundState.OPEN == "open" and f"{RoundState.OPEN}" == str(RoundState.OPEN) == "open"
    assert json.dumps({RoundState.CLOSED: [RoundState.FAILED]}) == '{"closed": ["failed"]}'
    assert choices(["a", "b", "c"]) == "'a', 'b' or 'c'" and choices(["a"], quote=False) == "a"


def test_secure_aggregation_needs_fedavg_and_three_clients_in_the_specs_words() -> None:
    with pytest.raises(ValidationError, match="robust rule needs each update"):
        FederationSpec.model_validate({**BASE, "min_clients": 3, "secure_aggregation": {}, "aggregation": {"name": "median"}})  # fmt: skip
    with pytest.raises(ValidationError, match="secure_aggregation needs min_clients of at least 3: with two"):
        FederationSpec.model_validate({**BASE, "min_clients": 2, "secure_aggregation": {}})
    check_secure_aggregation("fedavg", 3)  # the rule's one place: nothing to say
    with pytest.raises(ValueError) as exc:
        check_secure_aggregation("krum", 5)
    assert str(exc.value) == (
        "secure_aggregation cannot be combined with the krum rule: the coordinator sees only the sum of the "
        "masked updates, and a robust rule needs each update; use fedavg (optionally with a server "
        "optimiser) or drop secure_aggregation"
    )
