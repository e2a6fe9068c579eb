"""Per-class accuracy and macro-F1 of the coordinator's evaluations in simulate's round table,
results.json and rounds.csv."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from fedprompt.shared.spec import FederationSpec
from fedprompt.sim.results import round_records, write_results
from fedprompt.sim.tables import per_class_text, row_table
from rich.console import Console

from tests.helpers import SMALL_SPEC

EVALUATION = {
    "accuracy": 0.75,
    "clients": 2,
    "num_samples": 40,
    "confusion": [[20, 0], [10, 10]],
    "per_class_accuracy": [1.0, 0.5],
    "per_class_samples": [20, 20],
    "macro_f1": 0.7333333,
}


def _round(number: int) -> dict[str, Any]:
    return {
        "round": number,
        "attempt": 1,
        "state": "closed",
        "participants": [{"uploaded": True}] * 2,
        "seconds": 1.0,
        "evaluation": EVALUATION,
        "stats": {"participants": 2, "updates": 2, "bytes_up": 100, "bytes_down": 100},
    }


def test_per_class_accuracy_and_macro_f1_reach_the_table_results_and_rounds_csv(tmp_path: Path) -> None:
    spec = FederationSpec.model_validate({**SMALL_SPEC, "params_full_model": 1_000}).model_dump(mode="json")
    records = round_records([_round(1)], spec)

    assert records[0]["macro_f1"] == pytest.approx(0.7333333)
    assert records[0]["per_class_accuracy"] == [1.0, 0.5] and records[0]["confusion"] == [[20, 0], [10, 10]]
    assert per_class_text(records[0]["per_class_accuracy"]) == "100.0/50.0"
    console = Console(width=200, record=True)
    console.print(row_table(records[0], header=True))
    text = console.export_text()
    assert "macro-F1 %" in text and "73.3" in text and "100.0/50.0" in text

    results = write_results(tmp_path, spec, records, None, 1.0, {"labels": ["ham", "spam"]})
    assert results["rounds"][0]["macro_f1"] == pytest.approx(0.7333333)
    with open(tmp_path / "rounds.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["macro_f1"]) == pytest.approx(0.7333333)
    assert (float(row["accuracy_ham"]), float(row["accuracy_spam"])) == (1.0, 0.5)


def test_rounds_without_per_class_counts_leave_the_columns_empty(tmp_path: Path) -> None:
    spec = FederationSpec.model_validate({**SMALL_SPEC, "params_full_model": 1_000}).model_dump(mode="json")
    old = _round(1) | {"evaluation": {"accuracy": 0.5, "clients": 1, "num_samples": 10}}
    records = round_records([old], spec)

    write_results(tmp_path, spec, records, None, 1.0, {"labels": None})

    assert records[0]["macro_f1"] is None and per_class_text(records[0]["per_class_accuracy"]) == "-"
    header = (tmp_path / "rounds.csv").read_text().splitlines()[0]
    assert "macro_f1" in header and "accuracy_" not in header.replace("accuracy,", "")


def test_results_name_the_best_version_and_warn_of_a_constant_predictor(tmp_path: Path) -> None:
    spec = FederationSpec.model_validate(SMALL_SPEC).model_dump()
    flat = {**EVALUATION, "confusion": [[20, 0], [20, 0]], "per_class_accuracy": [1.0, 0.0]}
    flat |= {"accuracy": 0.5, "macro_f1": 1 / 3, "collapsed": True}
    rounds = [_round(1), {**_round(2), "evaluation": flat}]
    records = round_records(rounds, spec)
    initial = {**EVALUATION, "accuracy": 0.6, "macro_f1": 0.55, "confusion": [[12, 8], [8, 12]]}
    results = write_results(tmp_path, spec, records, initial, 1.0, {"labels": ["ham", "spam"]})
    assert results["final_collapsed"] is True and results["final_accuracy"] == 0.5
    assert results["best_version"] == 1 and results["best_accuracy"] == 0.75
    assert results["best_macro_f1"] == pytest.approx(0.7333333) and "collapsed" in results["best_rule"]
    console = Console(record=True, width=200)
    import fedprompt.sim.tables as tables

    before, tables.console = tables.console, console
    try:
        tables.print_summary(results, tmp_path)
    finally:
        tables.console = before
    text = console.export_text()
    assert "constant predictor" in text and "best version 1: accuracy 75.0 %" in text
