"""BENCHMARKS.md is what bench.report renders from the committed result files, and its prose types
in no figure that a result file does not hold."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from bench import prose, report
from bench.common import RESULTS, ROOT

PAGE = ROOT / "BENCHMARKS.md"

# Claims an earlier page made that its result files did not bear out; none may come back.
STALE = [
    "17–21×",
    "numpy lower bound",
    "the lower bound)",
    "met (SQLite 3 of 3 runs",
    "Postgres 2 of 3)",
]


def test_benchmarks_md_is_what_the_report_renders() -> None:
    actual = PAGE.read_text()
    expected = report.render(actual, RESULTS)
    if actual != expected:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(), expected.splitlines(), "BENCHMARKS.md", "rendered", lineterm=""
                )
            )[:60]
        )
        pytest.fail(f"BENCHMARKS.md differs from its rendering; run `python -m bench.report`:\n{diff}")


def test_every_figure_in_the_prose_comes_from_a_result_file() -> None:
    assert prose.unsourced(PAGE.read_text(), RESULTS) == []


def test_the_page_repeats_none_of_the_stale_claims() -> None:
    text = PAGE.read_text()
    assert [s for s in STALE if s in text] == []


def test_the_prose_check_catches_a_typed_figure(tmp_path: Path) -> None:
    doc = {"p99": 0.2566, "bytes": 181730746, "share": 0.189, "cmd": "--k 1000"}
    (tmp_path / "run.json").write_text(json.dumps(doc))
    page = (
        "## 1. A section\n\n"
        "<!-- bench:worker -->\n| 4.25 |\n<!-- /bench:worker -->\n\n"
        "From `run.json`: p99 0.26 s (257 ms), 173.3 MiB, 18.9 %, K = 1,000, 4.25 in the table, "
        "3 runs, issue 25, `--steps 77`, and 0.31 s from a run nobody kept; 0.26 ms is the wrong unit.\n\n"
        "## 2. Another\n\nHere 0.26 s cites nothing.\n"
    )
    assert prose.unsourced(page, tmp_path) == [
        "## 1. A section: 0.31",
        "## 1. A section: 0.26",
        "## 2. Another: 0.26",
    ]
