"""simulate's parts without processes: its options, round records and the ledger they carry."""

from __future__ import annotations

import csv
import dataclasses
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.coordinator.logic.ledger import ledger
from fedprompt.shared.spec import FederationSpec, default_lr
from fedprompt.shared.spec_options import DriftCorrectionSpec, label_skew_default
from fedprompt.sim.options import (
    DEFAULT_DRIFT_CORRECTION,
    SimulateOptions,
    parse_aggregation,
    parse_drift_correction,
    parse_server_optimizer,
    privacy_spec,
)
from fedprompt.sim.results import ldp_facts, round_records, write_results
from fedprompt.sim.simulate import simulate_command
from fedprompt.sim.tables import row_table

from tests.helpers import SMALL_SPEC

SPEC = FederationSpec.model_validate({**SMALL_SPEC, "params_full_model": 1_000}).model_dump(mode="json")


def test_simulate_options_hold_exactly_the_command_parameters() -> None:
    fields = [f.name for f in dataclasses.fields(SimulateOptions)]
    assert fields == list(inspect.signature(simulate_command).parameters)


def test_aggregation_option_parses_rule_and_numbers() -> None:
    assert parse_aggregation("multi_krum:f=1,m=7") == {"name": "multi_krum", "params": {"f": 1, "m": 7}}
    assert parse_aggregation("trimmed_mean:beta=0.2") == {"name": "trimmed_mean", "params": {"beta": 0.2}}
    with pytest.raises(ValueError, match="key=value"):
        parse_aggregation("median:0.2")


def test_each_option_names_itself_in_its_errors() -> None:
    with pytest.raises(
        ValueError, match=r"^--server-optimizer 'fedadam:lr': parameters are key=value, e.g. fedadam:lr=0.1$"
    ):
        parse_server_optimizer("fedadam:lr")
    with pytest.raises(ValueError, match=r"^--drift-correction needs a name, e.g. fedprox:mu=0.01$"):
        parse_drift_correction(":mu=1")
    with pytest.raises(ValueError, match=r"^--aggregation 'median:x': parameters are key=value"):
        parse_aggregation("median:x")


def test_drift_correction_option() -> None:
    assert parse_drift_correction("none") is None
    assert parse_drift_correction("fedprox") == {"name": "fedprox", "mu": 0.01}
    assert parse_drift_correction("fedprox:mu=0.5") == {"name": "fedprox", "mu": 0.5}
    assert parse_drift_correction("scaffold") == {"name": "scaffold"}
    with pytest.raises(ValueError, match="takes no mu"):
        parse_drift_correction("scaffold:mu=1")


def test_simulate_s_default_drift_correction_is_the_spec_s() -> None:
    """The option's default string and the spec's default_factory say the same thing."""
    parsed = parse_drift_correction(DEFAULT_DRIFT_CORRECTION)
    assert DriftCorrectionSpec.model_validate(parsed) == label_skew_default()
    assert FederationSpec.model_validate(SMALL_SPEC).drift_correction == label_skew_default()


def test_privacy_options_go_together() -> None:
    assert privacy_spec("laplace", None, None, None) is None
    with pytest.raises(ValueError, match="go together"):
        privacy_spec("laplace", 1.0, None, None)


def _round(number: int, state: str = "closed", **stats: Any) -> dict[str, Any]:
    return {
        "round": number,
        "attempt": 1,
        "state": state,
        "participants": [{"uploaded": True}] * 3,
        "seconds": 1.5,
        "evaluation": {"accuracy": 0.5 + number / 10, "clients": 3, "num_samples": 30},
        "stats": {"participants": 3, "updates": 2, "bytes_up": 100, "bytes_down": 150, **stats},
    }


def test_round_records_carry_the_coordinators_ledger() -> None:
    rounds = [_round(1), _round(2, updates=3), _round(3, state="open")]
    records = round_records(rounds, SPEC)
    assert [r["round"] for r in records] == [1, 2]
    sent = FederationSpec.model_validate(SPEC).params_communicated()
    book = ledger(
        [(r["round"], r["stats"]) for r in rounds[:2]], params_per_client=sent, params_full_model=1_000
    )
    for record, entry in zip(records, book["rounds"], strict=True):
        assert (record["params_up"], record["params_down"]) == (entry["params_up"], entry["params_down"])
        assert record["params_communicated"] == sent == book["params_communicated"]
        assert record["comm_ratio"] == book["comm_ratio"] == sent / 1_000
    assert records[1]["params_up"] == 3 * sent and records[1]["params_down"] == 3 * sent


def test_each_round_record_says_when_it_closed_from_the_first_rounds_opening(tmp_path: Path) -> None:
    rounds = [
        _round(1) | {"attempt": 1, "state": "failed", "opened_at": 1000.0, "closed_at": 1030.0},
        _round(1) | {"attempt": 2, "opened_at": 1030.0, "closed_at": 1042.5},
        _round(2) | {"opened_at": 1042.5, "closed_at": 1050.0},
        _round(3, state="open") | {"opened_at": 1050.0, "closed_at": None},
    ]
    records = round_records(rounds, SPEC)
    assert [(r["round"], r["elapsed_s"]) for r in records] == [(1, 42.5), (2, 50.0)]
    assert round_records([_round(1)])[0]["elapsed_s"] is None  # a coordinator that told no times
    write_results(tmp_path, SPEC, records, {"accuracy": 0.4}, 60.0, {})
    with open(tmp_path / "rounds.csv", newline="") as fh:
        assert [row["elapsed_s"] for row in csv.DictReader(fh)] == [
            "0.0",
            "42.5",
            "50.0",
        ]  # round 0: the start


def test_round_records_without_a_spec_count_no_parameters() -> None:
    (record,) = round_records([_round(1)])
    assert record["params_up"] == record["params_down"] == 0 and "comm_ratio" not in record


def test_write_results_writes_json_csv_and_the_accuracy_figure(tmp_path: Path) -> None:
    records = round_records([_round(1), _round(2)], SPEC)
    results = write_results(tmp_path, SPEC, records, {"accuracy": 0.4}, 12.0, {"clients": 3})
    assert results["final_accuracy"] == records[-1]["accuracy"] and results["total_bytes_up"] == 200
    assert json.loads((tmp_path / "results.json").read_text())["initial_accuracy"] == 0.4
    assert (tmp_path / "rounds.csv").read_text().splitlines()[0].startswith("round,participants,accuracy")
    assert (tmp_path / "accuracy.png").stat().st_size > 0 and not (tmp_path / "asr.png").exists()


def _columns(record: dict[str, Any], **kw: Any) -> list[str]:
    return [str(c.header) for c in row_table(record, True, **kw).columns]


def test_a_run_without_a_backdoor_has_no_asr_in_results_csv_or_table(tmp_path: Path) -> None:
    records = round_records([_round(1), _round(2)], SPEC)
    results = write_results(tmp_path, SPEC, records, {"accuracy": 0.4}, 12.0, {"clients": 3})

    saved = json.loads((tmp_path / "results.json").read_text())
    assert "final_asr" not in saved and "initial_asr" not in saved and "final_asr" not in results
    assert all("asr" not in r and "local_asr" not in r for r in saved["rounds"])
    assert "asr" not in (tmp_path / "rounds.csv").read_text().splitlines()[0].split(",")
    assert "ASR %" not in _columns(saved["rounds"][0]) and "local ASR %" not in _columns(saved["rounds"][0])


def test_a_run_that_measured_the_asr_keeps_it_everywhere(tmp_path: Path) -> None:
    rounds = [_round(1), _round(2)]
    for r in rounds:
        r["evaluation"]["asr"] = 0.25
    records = round_records(rounds, SPEC)
    write_results(tmp_path, SPEC, records, {"accuracy": 0.4, "asr": 0.1}, 12.0, {"clients": 3})

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["initial_asr"] == 0.1 and saved["final_asr"] == 0.25
    assert saved["rounds"][0]["asr"] == 0.25
    assert {"asr", "local_asr"} <= set((tmp_path / "rounds.csv").read_text().splitlines()[0].split(","))
    assert (tmp_path / "asr.png").exists()
    assert {"ASR %", "local ASR %"} <= set(_columns(saved["rounds"][0]))
    assert "ASR %" in _columns({**saved["rounds"][0], "asr": None}, asr=True)  # kept for the whole run


def test_results_state_the_ldp_calibration() -> None:
    assert ldp_facts(SPEC) == {}
    laplace = {**SPEC, "privacy": {"mechanism": "laplace", "epsilon": 2.0, "delta": None, "clip": 10.0}}
    assert ldp_facts(laplace)["ldp"] == {
        "mechanism": "laplace",
        "epsilon": 2.0,
        "delta": None,
        "clip": 10.0,
        "sensitivity": 20.0,
        "noise_scale": 10.0,
    }
    gaussian = {**SPEC, "privacy": {"mechanism": "gaussian", "epsilon": 1.0, "delta": 1e-5, "clip": 3.0}}
    facts = ldp_facts(gaussian)["ldp"]
    assert facts["sensitivity"] == 6.0 and facts["noise_std"] == pytest.approx(
        6.0 * facts["noise_multiplier"]
    )


@pytest.mark.parametrize("scoring, lr", [("mean-pool", 0.01), ("auto", 0.3), ("tied-embeddings", 0.3)])
def test_an_unset_learning_rate_follows_the_resolved_scoring(scoring: str, lr: float) -> None:
    assert default_lr(scoring) == lr
    assert inspect.signature(simulate_command).parameters["lr"].default is None
