"""bench/suite.py's reading of pytest's summary line and its table, on literal outputs and a literal result."""

from __future__ import annotations

from bench.report import suite_table
from bench.suite import pytest_summary

MACHINE = {
    "cpus": 2,
    "cpu_model": "AMD EPYC",
    "memory_gib": 23.5,
    "commit": "abc1234",
    "loadavg": [2.0, 1.5, 1.0],
}


def test_the_last_summary_line_is_read() -> None:
    output = (
        "........ [100%]\n"
        "=== short test summary info ===\n"
        "FAILED tests/x.py::test_y - AssertionError\n"
        "1 failed, 1707 passed, 19 skipped, 44 warnings in 636.96s (0:10:36)\n"
        "mypy (tools/typecheck.py):\nSuccess: no issues found in 224 source files\n"
    )
    assert pytest_summary(output) == {
        "passed": 1707,
        "failed": 1,
        "errors": 0,
        "skipped": 19,
        "pytest_s": 636.96,
    }
    assert pytest_summary("=== 3 passed, 2 errors in 1.50s ===")["errors"] == 2
    assert pytest_summary("make: *** [Makefile:61: test] Error 2\n")["pytest_s"] is None


def _run(busy: int, wall: float, failed: int = 0, rc: int = 0) -> dict:
    return {
        "busy_processes": busy,
        "wall_s": wall,
        "returncode": rc,
        "passed": 10,
        "failed": failed,
        "errors": 0,
        "skipped": 0,
        "pytest_s": wall - 20,
        "loadavg_start": [0.1, 0, 0],
        "loadavg_end": [2.5, 0, 0],
    }


def test_the_table_says_which_goal_each_run_meets() -> None:
    doc = {
        "command": "python -m bench.suite",
        "finished_at": "2026-12-07T08:00:00Z",
        "machine": MACHINE,
        "settings": {"command": "make test", "busy": 2, "idle_goal_s": 600.0},
        "runs": [_run(0, 599.4), _run(2, 1300.0, failed=1, rc=1)],
    }
    rows = suite_table(doc).splitlines()
    assert rows[2].startswith("| idle | nothing (idle) | **599 s** | 579 s | 10 | 0 |")
    assert rows[2].endswith("≤ 600 s and 0 failures: met |")
    assert rows[3].endswith("0 failures: not met |")
    doc["runs"][0]["wall_s"] = 600.6
    assert suite_table(doc).splitlines()[2].endswith("not met |")
