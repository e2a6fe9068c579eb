"""RESULTS.md is exactly what `fedprompt experiment report` renders from experiments/*.yaml and the
committed summaries in docs/results/*.json, and the prose it carries types no figure in by hand."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fedprompt.sim.experiments.config import load_config
from fedprompt.sim.experiments.findings import findings_in, findings_table
from fedprompt.sim.experiments.prose import PLACEHOLDER
from fedprompt.sim.experiments.report import experiments_of, findings, load_provenance, render_document

ROOT = Path(__file__).parents[2]
CONFIGS = sorted((ROOT / "experiments").glob("*.yaml"))
PAPER = ROOT.parent / "shared" / "PAPER.md"
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")

# Figures an earlier RESULTS.md quoted from cells no longer committed, and claims resting on round
# notes that are not committed: none of them may come back.
STALE = [
    "19.1 % after round 1",
    "ACC 71.0 %, ASR 13.4 %",
    "defence grid: 75.5 %",
    "75.2 → 71.0",
    "4,520",
    "54.6 to 66.4",
    "left exactly the malicious clients",
    "see paper",
]


def test_results_md_is_what_the_report_renders(tmp_path: Path) -> None:
    experiments = experiments_of(CONFIGS, tmp_path / "no-runs", ROOT / "docs" / "results", ROOT)
    expected = render_document(experiments, load_provenance(ROOT / "docs" / "results"))
    actual = (ROOT / "RESULTS.md").read_text()
    if actual != expected:
        diff = "\n".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(), expected.splitlines(), "RESULTS.md", "rendered", lineterm=""
                )
            )[:60]
        )
        pytest.fail(
            f"RESULTS.md differs from the report's rendering; run `fedprompt experiment report`:\n{diff}"
        )


def test_the_readme_findings_table_is_the_computed_verdicts(tmp_path: Path) -> None:
    experiments = experiments_of(CONFIGS, tmp_path / "no-runs", ROOT / "docs" / "results", ROOT)
    expected = findings_table(findings(experiments))
    assert expected.count("\n") >= 3  # the claims of Tables I and III at least
    assert findings_in((ROOT / "README.md").read_text()) == expected, (
        "the README's findings table differs from the verdicts; run `fedprompt experiment report`"
    )


def test_results_md_quotes_none_of_the_stale_figures() -> None:
    text = (ROOT / "RESULTS.md").read_text()
    assert [s for s in STALE if s in text] == []


def _numbers(value: Any) -> set[float]:
    """Every number written in a config value (strings included: 'multi_krum:f=2', '1,000 steps')."""
    if isinstance(value, dict):
        return set().union(*(_numbers(v) for v in value.values()), *(_numbers(k) for k in value))
    if isinstance(value, list):
        return set().union(*(_numbers(v) for v in value)) if value else set()
    if isinstance(value, bool) or value is None:
        return set()
    if isinstance(value, int | float):
        return {float(value)}
    return {float(n.replace(",", "")) for n in NUMBER.findall(str(value))}


def unsourced_numbers(data: dict[str, Any]) -> list[str]:
    """Numbers typed into a config's description or reading that neither a placeholder fills from
    the results nor the config itself holds (its options, grid, paper figures, sizes), apart from
    small counts (0 to 10)."""
    sourced = _numbers({k: v for k, v in data.items() if k not in ("description", "reading")})
    typed = []
    for key in ("description", "reading"):
        prose = PLACEHOLDER.sub(" ", str(data.get(key) or ""))
        for n in NUMBER.findall(prose):
            value = float(n.replace(",", ""))
            if value not in sourced and not (value.is_integer() and 0 <= value <= 10):
                typed.append(f"{key}: {n}")
    return typed


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_prose_types_no_figure_in(path: Path) -> None:
    assert unsourced_numbers(yaml.safe_load(path.read_text())) == []


def test_the_prose_check_catches_a_typed_figure() -> None:
    data = {"base": {"rounds": 2}, "reading": "ASR {{final_asr @ x=1}} %, rose 15 points in 2 rounds"}
    assert unsourced_numbers(data) == ["reading: 15"]


@pytest.mark.skipif(not PAPER.exists(), reason="../shared/PAPER.md is not in this checkout")
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_paper_figure_is_the_papers(path: Path) -> None:
    paper = PAPER.read_text()
    printed = {float(n.replace(",", "")) for n in NUMBER.findall(paper)}
    for entry in load_config(path).paper:
        values = [entry.value] if isinstance(entry.value, float | int) else []
        values += [float(n.replace(",", "")) for n in NUMBER.findall(str(entry.value))]
        assert all(v in printed for v in values), (entry.source, entry.model, entry.value)
        assert entry.model in paper or entry.model in ("—", "not stated") or "," in entry.model
