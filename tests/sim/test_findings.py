"""Findings a reviewer can check: t intervals, the learned rule and the claim verdicts against hand-worked
values, their placeholders in an experiment's prose, and the data sets' provenance in RESULTS.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from fedprompt.sim.experiments.config import ConfigError, load_config
from fedprompt.sim.experiments.findings import (
    findings_in,
    findings_of,
    findings_table,
    replace_findings,
    verdict_word,
)
from fedprompt.sim.experiments.prose import fill
from fedprompt.sim.experiments.verdicts import learned, mean_sd, paired, t_interval, verdict


def test_t_interval_of_three_values_by_hand() -> None:
    # mean 2, s = 1, t(0.975, 2) = 4.302653, half-width 4.302653 / sqrt(3) = 2.484138
    iv = t_interval([1.0, 2.0, 3.0])
    assert iv.n == 3 and iv.mean == 2.0
    assert math.isclose(iv.low, 2.0 - 2.484138, abs_tol=1e-6)
    assert math.isclose(iv.high, 2.0 + 2.484138, abs_tol=1e-6)
    one = t_interval([0.7])
    assert (one.low, one.mean, one.high, one.n) == (0.7, 0.7, 0.7, 1)
    with pytest.raises(ValueError):
        t_interval([])


def test_mean_and_sample_deviation_by_hand() -> None:
    assert mean_sd([70.0, 74.0, 78.0]) == (74.0, 4.0)  # squares 16 + 0 + 16 over n − 1 = 2
    assert mean_sd([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        mean_sd([])


def test_learned_needs_the_interval_above_the_majority_and_no_collapse() -> None:
    # 0.72 with s = 0.01 over 3 seeds: low = 0.72 − 4.3027·0.01/√3 = 0.6952
    assert learned([0.71, 0.72, 0.73], 0.69)
    assert not learned([0.71, 0.72, 0.73], 0.70)  # the interval reaches the majority rate
    assert not learned([0.71, 0.72, 0.73], 0.50, collapsed=[0.0, 1.0, 0.0])  # one seed collapsed
    assert learned([0.55], 0.50) and not learned([0.50], 0.50)  # one seed: above it, or not
    assert not learned([], 0.5)
    # macro-F1 at chance (1/k): a two-class cell at 0.72 accuracy whose macro-F1 is 0.38 to 0.42
    assert not learned([0.72, 0.72, 0.72], 0.5, macro_f1=[0.38, 0.40, 0.42], classes=2)
    assert learned([0.72, 0.72, 0.72], 0.5, macro_f1=[0.70, 0.71, 0.72], classes=2)
    assert learned([0.72, 0.72, 0.72], 0.5, macro_f1=[0.38, 0.40, 0.42])  # k unknown: not judged


def test_verdicts_of_a_claim_from_paired_differences() -> None:
    assert paired({0: 0.8, 1: 0.7, 2: 0.9}, {0: 0.7, 2: 0.85, 5: 0.1}) == pytest.approx([0.1, 0.05])
    # diffs 0.02, 0.03, 0.04: mean 0.03, s 0.01, interval 0.03 ± 0.0248 = [0.0052, 0.0548]
    assert verdict([0.02, 0.03, 0.04], ">", 0.0) == "holds"
    assert verdict([0.02, 0.03, 0.04], "<", 0.0) == "does not hold"
    assert verdict([0.02, 0.03, 0.04], ">", 0.01) == "inconclusive"  # 0.01 is inside the interval
    assert verdict([0.02, 0.03, 0.04], "<", 0.06) == "holds"
    assert verdict([0.02, 0.03, 0.04], ">", 0.06) == "does not hold"
    assert verdict([0.5], ">", 0.0) == "inconclusive"  # one seed decides nothing
    with pytest.raises(ValueError):
        verdict([0.1, 0.2], ">=", 0.0)


CONFIG = """
name: skew
title: "Skew"
base: {dataset: sst2, clients: 4, rounds: 1}
grid:
  arm: [a, b]
seeds: [0, 1, 2]
table: {rows: [variant], metrics: [final_accuracy]}
"""


def _record(
    variant: str, seed: int, accuracy: float, *, majority: float = 0.5, collapsed: float = 0.0
) -> dict[str, Any]:
    return {
        "cell": f"arm-{variant}_seed-{seed}",
        "seed": seed,
        "done": True,
        "options": {},
        "rounds": [],
        "metrics": {"final_accuracy": accuracy, "majority_rate": majority, "collapsed": collapsed},
    }


def test_verdict_and_learned_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "skew.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    records = [_record("a", s, acc) for s, acc in enumerate([0.72, 0.73, 0.74])]
    records += [_record("b", s, acc) for s, acc in enumerate([0.70, 0.70, 0.70])]
    assert (
        fill("{{verdict: final_accuracy @ arm=a - arm=b > 0}}", config, records)
        == "holds (+3.0 points, 95 % CI +0.5 to +5.5, 3 seeds)"
    )
    assert fill("{{verdict: final_accuracy @ arm=a - arm=b > 3}}", config, records).startswith(
        "inconclusive (+3.0 points"
    )
    assert fill("{{verdict: final_accuracy @ arm=a - arm=b < −1}}", config, records).startswith(
        "does not hold"
    )
    assert (
        fill("{{learned @ arm=a}}", config, records)
        == "learned (73.0 %, 95 % CI 70.5 to 75.5, majority 50.0 %)"
    )

    # seeds whose test subsets differ: the rule (and the text) takes the highest majority rate
    mixed = [
        _record("a", s, acc, majority=m) for s, (acc, m) in enumerate([(0.72, 0.5), (0.73, 0.6), (0.74, 0.5)])
    ]
    assert (
        fill("{{learned @ arm=a}}", config, mixed)
        == "learned (73.0 %, 95 % CI 70.5 to 75.5, majority up to 60.0 %)"
    )
    assert fill("{{learned @ arm=a}}", config, mixed[:1] + [_record("a", 1, 0.73, majority=0.73)]).startswith(
        "not learned (72.5 %"
    )

    collapsed = [r if r["cell"] != "arm-b_seed-1" else _record("b", 1, 0.5, collapsed=1.0) for r in records]
    assert fill("{{verdict: final_accuracy @ arm=a - arm=b > 0}}", config, collapsed).startswith(
        "not learned (the second cell; +"
    )
    assert fill("{{learned @ arm=b}}", config, collapsed).startswith("not learned (63.3 %")
    assert ", 1 of 3 collapsed)" in fill("{{learned @ arm=b}}", config, collapsed)
    with pytest.raises(ConfigError, match="must read 'A - B > δ'"):
        fill("{{verdict: final_accuracy @ arm=a - arm=b}}", config, records)
    with pytest.raises(ConfigError, match="must read 'A - B > δ'"):
        fill("{{verdict: final_accuracy @ arm=a}}", config, records)


def test_a_one_cell_verdict_judges_that_cells_values_over_its_seeds(tmp_path: Path) -> None:
    path = tmp_path / "skew.yaml"
    path.write_text(CONFIG)
    config = load_config(path)

    def gained(seed: int, gain: float, final: float = 0.75) -> dict[str, Any]:
        record = _record("a", seed, final)
        record["metrics"]["accuracy_gain"] = gain
        return record

    records = [gained(s, g) for s, g in enumerate([0.06, 0.07, 0.08])]
    # the gains' mean 7.0 points, t interval 7.0 ± 4.303 × 1.0 / √3 = 4.5 to 9.5
    assert (
        fill("{{verdict: accuracy_gain @ arm=a > 5}}", config, records)
        == "inconclusive (+7.0 points, 95 % CI +4.5 to +9.5, 3 seeds)"
    )
    assert fill("{{verdict: accuracy_gain @ arm=a > 4}}", config, records).startswith("holds (+7.0 points")
    assert fill("{{verdict: accuracy_gain @ arm=a < 4}}", config, records).startswith("does not hold")
    at_majority = [gained(s, g, final=0.5) for s, g in enumerate([0.06, 0.07, 0.08])]
    assert fill("{{verdict: accuracy_gain @ arm=a > 4}}", config, at_majority).startswith(
        "not learned (the cell; +7.0 points"
    )


def test_table_rows_in_prose_stay_rows(tmp_path: Path) -> None:
    path = tmp_path / "skew.yaml"
    path.write_text(CONFIG)
    config = load_config(path)
    records = [_record("a", 0, 0.7)]
    text = (
        "Intro\nwrapped.\n\n| arm | acc |\n|---|---|\n| a | {{final_accuracy @ arm=a}} |\nAfter\nthe table."
    )
    assert (
        fill(text, config, records)
        == "Intro wrapped.\n\n| arm | acc |\n|---|---|\n| a | 70.0 |\nAfter the table."
    )


def test_provenance_takes_each_found_meta_and_keeps_the_committed_rest(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import json

    from fedprompt.sim.experiments.report import head, load_provenance, update_provenance

    data = tmp_path / "datasets" / "toy"
    data.mkdir(parents=True)
    meta = {
        "name": "Toy",
        "source": "re-split 80/20 | seed 13 <br />",
        "origin": "here",
        "splits": {"train": {"rows": 1200}, "test": {"rows": 300}},
    }
    (data / "meta.json").write_text(json.dumps(meta))
    figs = tmp_path / "results"
    figs.mkdir()
    (figs / "datasets.json").write_text(json.dumps({"gone": {"source": "kept", "train": 1, "test": 2}}))
    monkeypatch.setenv("FEDPROMPT_DATASETS", str(tmp_path / "datasets"))
    got = update_provenance({"toy", "absent"}, figs)
    assert list(got) == ["gone", "toy"] and got["toy"]["train"] == 1200 and got["toy"]["test"] == 300
    assert load_provenance(figs) == got
    text = head(got)
    assert "toy: re-split 80/20 \\| seed 13 &lt;br /> (1,200 train, 300 test)" in text
    assert "gone: kept (1 train, 2 test)" in text


# -- the README's findings table, from a reading's tables ------------------------------------------

RAW = """Some words.

| data set | A − B > 0 | its accuracy % |
|---|---|---|
| SST-2 | {{verdict: final_accuracy @ d=sst2, v=a - d=sst2, v=b > 0}} | {{final_accuracy @ d=sst2}} |
| Twitter | {{verdict: final_accuracy @ d=twitter, v=a - d=twitter, v=b > 0}} | {{final_accuracy @ d=twitter}} |
| Enron | {{verdict: final_accuracy @ d=enron, v=a - d=enron, v=b > 0}} | {{final_accuracy @ d=enron}} |
"""
RENDERED = """Some words.

| data set | A − B > 0 | its accuracy % |
|---|---|---|
| SST-2 | holds (+3.0 points, 95 % CI +1.0 to +5.0, 3 seeds) | 80.0 |
| Twitter | inconclusive (+1.0 points, 95 % CI −2.0 to +4.0, 3 seeds) | 88.0 |
| Enron | holds (+2.0 points, 95 % CI +0.5 to +3.5, 3 seeds) | 97.0 |
"""


def test_a_reading_column_of_verdicts_is_one_finding_with_its_rows_by_verdict() -> None:
    (found,) = findings_of("Table X: a test", RAW, RENDERED)
    assert found.claim == "A − B > 0" and found.anchor == "table-x-a-test"
    assert found.rows == {"holds": ["SST-2", "Enron"], "inconclusive": ["Twitter"]}
    table = findings_table([found])
    assert table.splitlines()[2] == (
        "| [Table X: a test](RESULTS.md#table-x-a-test): A − B > 0 | SST-2, Enron | – | Twitter | – |"
    )


def test_rows_of_one_data_set_are_told_apart_by_the_tables_other_key_cells() -> None:
    raw = (
        "| data set | α | A − B > 0 |\n|---|---|---|\n"
        "| SST-2 | 0.1 | {{verdict: final_accuracy @ d=sst2, a=0.1 - d=sst2 > 0}} |\n"
        "| SST-2 | 0.5 | {{verdict: final_accuracy @ d=sst2, a=0.5 - d=sst2 > 0}} |\n"
    )
    rendered = (
        "| data set | α | A − B > 0 |\n|---|---|---|\n"
        "| SST-2 | 0.1 | holds (+3.0 points, …) |\n| SST-2 | 0.5 | inconclusive (+1.0 points, …) |\n"
    )
    (found,) = findings_of("Table Y", raw, rendered)
    assert found.rows == {"holds": ["SST-2 (α 0.1)"], "inconclusive": ["SST-2 (α 0.5)"]}


def test_verdict_words_are_read_whole() -> None:
    assert verdict_word("does not hold (−4.0 points, …)") == "does not hold"
    assert verdict_word("not learned (both cells; …)") == "not learned"
    assert verdict_word("holdsworth") is None and verdict_word("80.0") is None


def test_the_readme_block_is_replaced_between_its_markers_and_missing_markers_are_refused() -> None:
    readme = "intro\n<!-- findings -->\nold\n<!-- /findings -->\nrest\n"
    assert (
        replace_findings(readme, "| new |") == "intro\n<!-- findings -->\n| new |\n<!-- /findings -->\nrest\n"
    )
    assert findings_in(replace_findings(readme, "| new |")) == "| new |"
    with pytest.raises(ValueError, match="findings table"):
        replace_findings("no markers", "| new |")
