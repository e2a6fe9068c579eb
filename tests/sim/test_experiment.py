"""Experiment runner and report: grid expansion per seed, resume, skipped options, tables beside the
paper's figures (mean ± std over seeds), placeholders in the prose, RESULTS.md rendered whole.

The simulate process is replaced by a fake runner that writes a results.json; the real simulate is
exercised end to end in tests/e2e/test_attack.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.sim.argv import to_args
from fedprompt.sim.experiments import runner
from fedprompt.sim.experiments.config import ConfigError, ExperimentConfig, cell_id, expand, load_config
from fedprompt.sim.experiments.prose import fill, stat
from fedprompt.sim.experiments.records import cell_metrics, collect, metrics_of
from fedprompt.sim.experiments.report import _line_series, caption, committed_cells, pivot, report
from fedprompt.sim.experiments.runner import run_experiment, same_options, warm_prompts_dir

CONFIG = """
name: demo
title: "Demo grid"
base: {dataset: sst2, clients: 10, rounds: 2, train_limit: 200}
grid:
  malicious: [1, 2]
  aggregation: [fedavg, "trimmed_mean:beta=0.2"]
extra_cells:
  - {malicious: 0, aggregation: fedavg}
seeds: [0]
table: {rows: [malicious], columns: [aggregation], metrics: [final_accuracy, final_asr]}
paper:
  - {source: "Table III", model: BERT, metric: final_asr, match: {malicious: 1, aggregation: fedavg}, value: 12.3}
  - {source: "Table III", model: BERT, value: "no figure for 2"}
"""


def _config(tmp_path: Path, text: str = CONFIG) -> tuple[ExperimentConfig, Path]:
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    return load_config(path), path


def _results(rounds: int, acc: float, asr: float, local: float | None = None) -> dict[str, Any]:
    recs = [
        {"round": r, "accuracy": acc, "asr": asr, "local_asr": local, "notes": {"3": "x"} if r == 1 else {}}
        for r in range(1, rounds + 1)
    ]
    return {
        "rounds": recs,
        "initial_accuracy": 0.5,
        "final_accuracy": acc,
        "initial_asr": 0.1,
        "final_asr": asr,
        "wall_seconds": 12.0,
    }


class FakeSimulate:
    """Stands in for `fedprompt simulate`: records the arguments, writes results.json into --out."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail or set()

    def __call__(self, args: list[str], log: Path) -> int:
        self.calls.append(args)
        out = Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if out.name in self.fail:
            return 1
        malicious = int(args[args.index("--malicious") + 1])
        (out / "results.json").write_text(json.dumps(_results(2, 0.8 - 0.1 * malicious, 0.1 * malicious)))
        return 0


def test_grid_expands_to_the_product_plus_extra_cells_with_stable_ids(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    cells = expand(config)
    assert [c.id for c in cells] == [
        "malicious-0_aggregation-fedavg_seed-0",
        "malicious-1_aggregation-fedavg_seed-0",
        "malicious-1_aggregation-trimmed-mean-beta-0.2_seed-0",
        "malicious-2_aggregation-fedavg_seed-0",
        "malicious-2_aggregation-trimmed-mean-beta-0.2_seed-0",
    ]
    assert cells[2].options == {
        "dataset": "sst2",
        "clients": 10,
        "rounds": 2,
        "train_limit": 200,
        "malicious": 1,
        "aggregation": "trimmed_mean:beta=0.2",
        "seed": 0,
    }
    assert cell_id({"ldp_epsilon": None}, 3) == "ldp-epsilon-none_seed-3"


def test_to_args_maps_names_to_flags_and_drops_none() -> None:
    assert to_args(
        {"local_steps": 5, "ldp_epsilon": None, "baseline": True, "verbalizer": [["a"], ["b"]]}
    ) == [
        "--local-steps",
        "5",
        "--baseline",
        "--verbalizer",
        '[["a"], ["b"]]',
    ]


def test_bad_config_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="grid"):
        _config(tmp_path, "name: x\ntitle: t\ngrid: {clients: []}\n")
    with pytest.raises(ConfigError, match="name"):
        _config(tmp_path, "name: 'Bad Name'\ntitle: t\n")


def test_run_resumes_by_skipping_finished_cells(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    fake = FakeSimulate(fail={"malicious-2_aggregation-fedavg_seed-0"})
    first = run_experiment(config, tmp_path / "runs", runner=fake, echo=lambda _: None, limit=4)
    assert [s["status"] for s in first] == ["done", "done", "done", "failed (exit 1)", "pending"]
    assert "--aggregation" in fake.calls[2] and "trimmed_mean:beta=0.2" in fake.calls[2]
    cell = json.loads((tmp_path / "runs/demo/malicious-1_aggregation-fedavg_seed-0/cell.json").read_text())
    assert cell["returncode"] == 0 and cell["command"].startswith("fedprompt simulate ")

    fake2 = FakeSimulate()
    second = run_experiment(config, tmp_path / "runs", runner=fake2, echo=lambda _: None)
    assert all(s["status"] == "done" for s in second)
    ran = [Path(a[a.index("--out") + 1]).name for a in fake2.calls]
    assert ran == [
        "malicious-2_aggregation-fedavg_seed-0",
        "malicious-2_aggregation-trimmed-mean-beta-0.2_seed-0",
    ]


def test_seeds_run_the_grid_whole_for_one_seed_first(tmp_path: Path) -> None:
    config, _ = _config(tmp_path, CONFIG.replace("seeds: [0]", "seeds: [0, 1]"))
    fake = FakeSimulate()
    first = run_experiment(config, tmp_path / "runs", runner=fake, echo=lambda _: None, seeds=[1])
    ran = sorted(Path(a[a.index("--out") + 1]).name for a in fake.calls)
    assert len(ran) == 5 and all(name.endswith("_seed-1") for name in ran)
    assert [s["status"] for s in first if s["cell"].endswith("_seed-0")] == ["pending"] * 5

    fake2 = FakeSimulate()
    second = run_experiment(config, tmp_path / "runs", runner=fake2, echo=lambda _: None)
    assert all(s["status"] == "done" for s in second)
    assert sorted(Path(a[a.index("--out") + 1]).name for a in fake2.calls) == [
        n.removesuffix("_seed-1") + "_seed-0" for n in ran
    ]


def test_seeds_option_names_the_configs_seeds(tmp_path: Path) -> None:
    from fedprompt.sim.experiments.cli import app
    from typer.testing import CliRunner

    _, path = _config(tmp_path)
    result = CliRunner().invoke(app, ["run", str(path), "--seeds", "3", "--dry-run"])
    assert result.exit_code == 2 and "seeds of the config's [0]" in result.output


def test_where_runs_only_the_cells_with_those_grid_values(tmp_path: Path) -> None:
    config, path = _config(tmp_path)
    fake = FakeSimulate()
    statuses = run_experiment(
        config, tmp_path / "runs", runner=fake, echo=lambda _: None, where={"aggregation": ["fedavg"]}
    )
    ran = sorted(Path(a[a.index("--out") + 1]).name for a in fake.calls)
    assert ran == [
        "malicious-0_aggregation-fedavg_seed-0",
        "malicious-1_aggregation-fedavg_seed-0",
        "malicious-2_aggregation-fedavg_seed-0",
    ]
    assert sorted(s["status"] for s in statuses) == ["done"] * 3 + ["pending"] * 2

    from fedprompt.sim.experiments.cli import app
    from typer.testing import CliRunner

    listed = CliRunner().invoke(app, ["run", str(path), "--where", "malicious=2", "--dry-run"])
    assert listed.exit_code == 0 and "2 cells" in listed.output
    bad = CliRunner().invoke(app, ["run", str(path), "--where", "malicious=7", "--dry-run"])
    assert bad.exit_code == 2 and "--where 'malicious=7'" in bad.output and "malicious: 0, 1, 2" in bad.output


def test_a_cell_that_ran_with_other_options_runs_again_and_is_not_reported(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    changed, _ = _config(tmp_path, CONFIG.replace("train_limit: 200", "train_limit: 300"))
    assert not any(r["done"] for r in collect(changed, tmp_path / "runs"))  # not the new cells' results

    fake = FakeSimulate()
    statuses = run_experiment(changed, tmp_path / "runs", runner=fake, echo=lambda _: None)
    assert all(s["status"] == "done" for s in statuses) and len(fake.calls) == len(statuses)
    assert all(a[a.index("--train-limit") + 1] == "300" for a in fake.calls)
    folder = tmp_path / "runs/demo"
    aside = sorted(p.name for p in folder.iterdir() if ".other-options-" in p.name)
    assert len(aside) == len(statuses)  # the old runs kept beside, not resumed
    assert all(r["done"] for r in collect(changed, tmp_path / "runs"))
    # the same options again: nothing reruns
    again = FakeSimulate()
    run_experiment(changed, tmp_path / "runs", runner=again, echo=lambda _: None)
    assert again.calls == []


def test_a_cell_stopped_mid_run_is_not_reported_as_run(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    stopped = sorted((tmp_path / "runs/demo").glob("*/results.json"))[0]
    results = json.loads(stopped.read_text())
    stopped.write_text(
        json.dumps({**results, "rounds": [], "final_accuracy": None})
    )  # as a SIGTERM leaves it
    records = collect(config, tmp_path / "runs")
    assert [r["done"] for r in records].count(False) == 1
    assert next(r for r in records if not r["done"])["cell"] == stopped.parent.name


def test_an_older_cell_record_is_checked_on_the_options_it_passed(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    for meta_path in (tmp_path / "runs/demo").glob("*/cell.json"):  # as written before cell_options
        meta = json.loads(meta_path.read_text())
        del meta["cell_options"]
        meta_path.write_text(json.dumps(meta))
    assert all(r["done"] for r in collect(config, tmp_path / "runs"))
    changed, _ = _config(tmp_path, CONFIG.replace("rounds: 2", "rounds: 3"))
    assert not any(r["done"] for r in collect(changed, tmp_path / "runs"))


def test_cells_with_options_simulate_lacks_are_skipped_unless_at_their_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "simulate_options", lambda: {"rounds", "malicious", "out", "seed"})
    text = "name: m\ntitle: t\nbase: {rounds: 1, malicious: 0}\ngrid:\n  method: [prompt_tuning, p_tuning]\n"
    config, _ = _config(tmp_path, text)
    fake = FakeSimulate()
    statuses = run_experiment(config, tmp_path / "runs", runner=fake, echo=lambda _: None)
    assert statuses[0]["status"] == "done" and "--method" not in fake.calls[0]
    assert statuses[1]["status"] == "skipped: simulate has no option ['method']"
    assert len(fake.calls) == 1


def test_cell_metrics_from_results() -> None:
    m = cell_metrics(_results(3, 0.75, 0.2, local=0.9))
    assert m["final_accuracy"] == 0.75 and m["initial_asr"] == 0.1 and m["final_asr"] == 0.2
    assert m["max_local_asr"] == 0.9 and m["local_asr"] == pytest.approx(0.9)
    assert m["rejected"] == 1 and m["rounds"] == 3
    assert (
        m["final_macro_f1"] is None and m["majority_rate"] is None
    )  # the results carry no per-class figures


def test_macro_f1_and_the_majority_class_rate_come_from_the_last_round() -> None:
    results = _results(2, 0.7, 0.2)
    results["rounds"][-1] |= {"macro_f1": 0.55, "confusion": [[290, 10], [80, 20]]}
    m = cell_metrics(results)
    assert m["final_macro_f1"] == 0.55
    assert m["majority_rate"] == 0.75  # 300 of 400 evaluated examples are label 0: 70 % does not beat it


def test_report_writes_results_md_whole_with_the_papers_figure_beside_ours(tmp_path: Path) -> None:
    config, path = _config(tmp_path)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    md = tmp_path / "RESULTS.md"
    md.write_text("# Results\n\nHand-written text is replaced.\n")
    report([path], tmp_path / "runs", md, tmp_path / "figs", tmp_path)
    text = md.read_text()
    assert (
        "Hand-written text is replaced." not in text and "Generated by `fedprompt experiment report`" in text
    )
    assert "5 of 5 cells run" in text and "gradient clipping at max-norm 1.0" in text
    assert (
        "| malicious | aggregation=fedavg ACC | aggregation=fedavg ASR | aggregation=fedavg paper ASR |"
        in text
    )
    assert "| 1 | 70.0 | 10.0 | BERT 12.30 | 70.0 | 10.0 |" in text
    assert "| 0 | 80.0 | 0.0 | – | – | – |" in text
    assert "The paper also reports (no cell here measures it): Table III (BERT): no figure for 2." in text
    assert "Measured at: ours all-MiniLM-L6-v2, 10 clients" in text
    assert json.loads((tmp_path / "figs/demo.json").read_text())["cells"][0]["done"] is True


def test_a_grid_resumes_from_the_committed_summary_on_another_machine(tmp_path: Path) -> None:
    config, path = _config(tmp_path)
    figs, md = tmp_path / "figs", tmp_path / "RESULTS.md"
    run_experiment(config, tmp_path / "first", runner=FakeSimulate(), echo=lambda _: None, limit=2)
    report([path], tmp_path / "first", md, figs, tmp_path)  # the committed summary holds 2 cells

    # a fresh machine: no runs folder; the committed cells are skipped, the rest run
    committed = committed_cells(figs, "demo")
    assert sorted(committed) == [cell.id for cell in expand(config)[:2]]
    fake = FakeSimulate()
    statuses = run_experiment(
        config, tmp_path / "second", runner=fake, echo=lambda _: None, committed=committed
    )
    assert all(s["status"] == "done" for s in statuses) and len(fake.calls) == 3
    report([path], tmp_path / "second", md, figs, tmp_path)
    summary = json.loads((figs / "demo.json").read_text())["cells"]
    assert [c["done"] for c in summary] == [True] * 5 and "5 of 5 cells run" in md.read_text()

    # a changed shared option makes every committed cell stale
    changed, _ = _config(tmp_path, CONFIG.replace("rounds: 2", "rounds: 3"))
    fake = FakeSimulate()
    run_experiment(changed, tmp_path / "third", runner=fake, echo=lambda _: None, committed=committed)
    assert len(fake.calls) == 5


WARM_CONFIG = """
name: warm
title: "Warm grid"
base: {dataset: sst2, clients: 4, rounds: 1}
warm_start: {steps: 10, train_limit: 100}
grid:
  malicious: [0, 1]
table: {rows: [malicious], metrics: [final_accuracy]}
"""


class WarmFake(FakeSimulate):
    """Also trains the warm start: `--save-prompt` gets `prompt` as its bytes."""

    def __init__(self, prompt: bytes) -> None:
        super().__init__()
        self.prompt = prompt

    def __call__(self, args: list[str], log: Path) -> int:
        if "--save-prompt" in args:
            self.calls.append(args)
            Path(args[args.index("--save-prompt") + 1]).write_bytes(self.prompt)
            return 0
        return super().__call__(args, log)


def test_a_committed_cell_counts_only_when_it_started_from_the_same_prompt(tmp_path: Path) -> None:
    import hashlib

    config, path = _config(tmp_path, WARM_CONFIG)
    figs, md = tmp_path / "figs", tmp_path / "RESULTS.md"
    first = WarmFake(b"prompt A")
    run_experiment(config, tmp_path / "first", runner=first, echo=lambda _: None)
    assert len(first.calls) == 3  # the warm start, then both cells
    report([path], tmp_path / "first", md, figs, tmp_path)
    committed = committed_cells(figs, "warm")
    assert {c["start_sha256"] for c in committed.values()} == {hashlib.sha256(b"prompt A").hexdigest()}

    same = WarmFake(b"prompt A")  # another machine trains the same warm start: the cells are reused
    statuses = run_experiment(
        config, tmp_path / "second", runner=same, echo=lambda _: None, committed=committed
    )
    assert [s["status"] for s in statuses] == ["done", "done"] and len(same.calls) == 1

    # report committed the warm start those cells started from: a machine that would train another
    # prompt takes the committed one instead, and the committed cells still count
    assert (figs / "warm").is_dir() and [p.read_bytes() for p in (figs / "warm").iterdir()] == [b"prompt A"]
    elsewhere = WarmFake(b"prompt C")
    statuses = run_experiment(
        config,
        tmp_path / "elsewhere",
        runner=elsewhere,
        echo=lambda _: None,
        committed=committed,
        committed_warm=warm_prompts_dir(figs),
    )
    assert [s["status"] for s in statuses] == ["done", "done"] and elsewhere.calls == []

    other = WarmFake(b"prompt B")  # a build whose warm start differs: the committed cells are stale
    run_experiment(
        config, tmp_path / "third", runner=other, echo=lambda _: None, committed=committed, limit=1
    )
    assert len(other.calls) == 2  # the warm start and one cell (limit 1)
    report([path], tmp_path / "third", md, figs, tmp_path)
    summary = json.loads((figs / "warm.json").read_text())["cells"]
    assert [c["done"] for c in summary] == [True, False]  # the stale cell is not mixed into the table
    assert summary[0]["start_sha256"] == hashlib.sha256(b"prompt B").hexdigest()


def test_pivot_of_an_unrun_experiment_shows_dashes(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    table = pivot(config, [])
    assert table.splitlines()[0].startswith("| malicious | aggregation=fedavg ACC")
    assert "| 2 | – | – | – | – | – |" in table
    assert "| 1 | – | – | BERT 12.30 | – | – |" in table


def test_report_draws_the_configured_figures(tmp_path: Path) -> None:
    text = (
        CONFIG
        + """plots:
  - {kind: asr, file: asr.png, cell: {malicious: 1, aggregation: fedavg}}
  - {kind: lines, file: lines.png, x: malicious, y: final_asr, series: aggregation}
"""
    )
    config, path = _config(tmp_path, text)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    results = tmp_path / "runs/demo/malicious-1_aggregation-fedavg_seed-0/results.json"
    data = json.loads(results.read_text()) | {"spec": {"aggregation": {"name": "fedavg"}}, "clients": 10}
    results.write_text(json.dumps(data))
    report([path], tmp_path / "runs", tmp_path / "RESULTS.md", tmp_path / "figs", tmp_path)
    for name in ("asr.png", "lines.png"):
        assert (tmp_path / "figs" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![demo](figs/asr.png)" in (tmp_path / "RESULTS.md").read_text()
    # on a machine without the runs folder the committed figures stay linked
    report([path], tmp_path / "gone", tmp_path / "RESULTS.md", tmp_path / "figs", tmp_path)
    text = (tmp_path / "RESULTS.md").read_text()
    assert "![demo](figs/asr.png)" in text and "![demo](figs/lines.png)" in text
    # each figure says what it shows: the per-round plot one seed's federation, the lines the seeds' mean
    assert "*Figure: one federation, seed 0 of the cell malicious = 1, aggregation = fedavg" in text
    assert (
        "*Figure: each point is the mean over the seeds run (0); the band is ± one standard deviation.*"
        in text
    )


def test_a_lines_series_is_the_mean_and_deviation_over_the_seeds(tmp_path: Path) -> None:
    config, _ = _config(tmp_path, SEEDED + "plots:\n  - {kind: lines, file: l.png, x: malicious}\n")
    records = [
        _record(f"malicious-{m}_seed-{s}", s, {}, final_accuracy=acc) | {"params": {"malicious": m}}
        for m, accs in ((0, (0.70, 0.74, 0.78)), (1, (0.60, 0.60, 0.60)))
        for s, acc in enumerate(accs)
    ]
    series = _line_series(config, config.plots[0], records)
    (label,) = series
    assert [(x, round(mean, 6), round(sd, 6)) for x, mean, sd in series[label]] == [
        (0.0, 74.0, 4.0),
        (1.0, 60.0, 0.0),
    ]
    assert caption(config, config.plots[0], records).startswith(
        "*Figure: each point is the mean over the seeds run (0, 1, 2)"
    )


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).parents[2].joinpath("experiments").glob("*.yaml")), ids=str
)
def test_every_shipped_config_loads_and_speaks_simulate(path: Path) -> None:
    config = load_config(path)
    known = runner.simulate_options()
    cells = expand(config)
    assert cells, f"{path.name} expands to no cell"
    for cell in cells:
        assert runner.unsupported(cell.options, known) == {}, (path.name, cell.id)


def _record(cell: str, seed: int, options: dict[str, Any], **metrics: Any) -> dict[str, Any]:
    return {"cell": cell, "seed": seed, "done": True, "options": options, "metrics": metrics, "rounds": []}


SEEDED = """
name: seeded
title: "Seeds"
base: {dataset: sst2, clients: 4, rounds: 1}
grid:
  malicious: [0, 1]
seeds: [0, 1, 2]
table: {rows: [malicious], metrics: [final_accuracy]}
reading: "ACC {{final_accuracy @ malicious=1}} %, {{final_accuracy @ malicious=1 - malicious=0}} points over clean"
"""


def test_cells_expand_per_seed_and_the_table_shows_mean_std_and_n(tmp_path: Path) -> None:
    config, _ = _config(tmp_path, SEEDED)
    assert [c.id for c in expand(config)] == [f"malicious-{m}_seed-{s}" for m in (0, 1) for s in (0, 1, 2)]
    records = [
        _record("malicious-0_seed-0", 0, {}, final_accuracy=0.8),  # one seed committed: its value
        _record("malicious-1_seed-0", 0, {}, final_accuracy=0.6),
        _record("malicious-1_seed-1", 1, {}, final_accuracy=0.7),
        _record("malicious-1_seed-2", 2, {}, final_accuracy=0.8),
    ]
    table = pivot(config, records)
    assert "| 0 | 80.0 |" in table
    assert "| 1 | 70.0 ± 10.0 (3) |" in table  # mean ± sample std (n)
    assert fill(config.reading, config, records) == "ACC 70.0 ± 10.0 %, −10.0 points over clean"
    # one seed by name
    assert fill("{{final_accuracy @ malicious=1, seed=2}}", config, records) == "80.0"
    assert fill("{{final_accuracy @ malicious=1, seed=0 - malicious=0, seed=0}}", config, records) == "−20.0"
    assert fill("{{final_accuracy @ malicious=0, seed=1}}", config, records) == "–"  # not run


def test_placeholders_name_one_cell_and_series_run_from_round_zero(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    record = _record("malicious-1_aggregation-fedavg_seed-0", 0, {}, initial_asr=0.1)
    record["rounds"] = [{"round": 1, "asr": 0.5}, {"round": 2, "asr": 0.25}]
    assert fill("{{series:asr @ malicious=1, aggregation=fedavg}}", config, [record]) == "10.0 → 50.0 → 25.0"
    assert fill("{{final_asr @ malicious=2, aggregation=fedavg}}", config, [record]) == "–"  # not run
    with pytest.raises(ConfigError, match="matches 2 cells"):
        fill("{{final_asr @ malicious=1}}", config, [record])


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "{source: T, model: BERT, metric: max_asr, match: {malicious: 1}, value: 1}",
            "not one of table.metrics",
        ),
        ("{source: T, model: BERT, match: {partition: iid}, value: 1}", "not a key of base, grid"),
        ("{source: T, model: BERT, match: {malicious: 7}, value: 1}", "matches no cell"),
        ("{model: BERT, value: 1}", "source"),
    ],
)
def test_paper_entries_are_validated(tmp_path: Path, entry: str, message: str) -> None:
    text = CONFIG.split("paper:")[0] + f"paper:\n  - {entry}\n"
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, text)


def test_a_record_from_before_measure_asr_matches_either_setting() -> None:
    old = {"dataset": "sst2", "seed": 0}
    assert same_options(old, {"dataset": "sst2", "seed": 0, "measure_asr": True})
    assert same_options(old, {"dataset": "sst2", "seed": 0})
    assert not same_options(
        {**old, "measure_asr": False}, {"dataset": "sst2", "seed": 0, "measure_asr": True}
    )
    assert not same_options(old, {"dataset": "sst2", "seed": 1, "measure_asr": True})
    assert same_options(None, {"anything": 1})  # a summary written before records carried options


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "experiments").glob("*.yaml")), ids=str)
def test_every_grid_cell_names_its_drift_correction(path: Path) -> None:
    """A grid that leaves drift correction to simulate's default would silently change what its
    cells measure when the default changes; every cell names it (none: FedAvg, as the paper)."""
    unnamed = [cell.id for cell in expand(load_config(path)) if "drift_correction" not in cell.options]
    assert not unnamed, f"{path.name}: cells without drift_correction: {unnamed[:3]}"


def test_a_record_without_drift_correction_ran_with_none() -> None:
    """Records from before the label-skew default name no drift correction: they ran with none."""
    old = {"dataset": "sst2", "seed": 0}
    assert same_options(old, {**old, "drift_correction": "none"})
    assert not same_options(old, {**old, "drift_correction": "balanced:entropy_scaling=true"})
    assert same_options({**old, "drift_correction": "fedprox"}, {**old, "drift_correction": "fedprox"})


LDP = """
name: ldp
title: "LDP"
base: {dataset: sst2, clients: 2, rounds: 2, fraction: 1.0}
grid:
  ldp_epsilon: [10]
  ldp_clip: [4.0]
extra_cells:
  - {ldp_epsilon: null, ldp_clip: null}
table: {rows: [ldp_epsilon], metrics: [epsilon, epsilon_cumulative, noise]}
"""


def test_ldp_cells_from_before_the_calibration_are_shown_with_the_epsilon_they_guaranteed_and_rerun(
    tmp_path: Path,
) -> None:
    config, path = _config(tmp_path, LDP)
    cell = "ldp-epsilon-10_ldp-clip-4.0_seed-0"
    options = {
        "dataset": "sst2",
        "clients": 2,
        "rounds": 2,
        "fraction": 1.0,
        "ldp_epsilon": 10,
        "ldp_clip": 4.0,
    }
    old = _record(cell, 0, {**options, "seed": 0}, epsilon=10.0, epsilon_cumulative=20.0, rounds=2)
    m = metrics_of(old)
    assert (m["epsilon"], m["epsilon_cumulative"], m["noise"]) == (20.0, 40.0, 0.4)  # scale clip/ε: 2ε-DP
    new = {**old, "ldp_sensitivity": 8.0}
    m = metrics_of(new)
    assert (m["epsilon"], m["epsilon_cumulative"], m["noise"]) == (10.0, 20.0, 0.8)  # scale 2·clip/ε

    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "ldp.json").write_text(json.dumps({"experiment": "ldp", "cells": [old]}))
    md = tmp_path / "RESULTS.md"
    report([path], tmp_path / "runs", md, figs, tmp_path)
    text = md.read_text()
    assert "| 10 | 20 | 40 | 0.4 |" in text and "| off | – | – | – |" in text
    assert "1 of these cells ran before LDP was calibrated" in text
    fake = FakeSimulate()
    committed = committed_cells(figs, "ldp")
    run_experiment(
        config,
        tmp_path / "runs",
        runner=lambda a, log: fake(a + ["--malicious", "0"], log),
        echo=lambda _: None,
        committed=committed,
    )
    assert len(fake.calls) == 2  # the no-LDP reference and the outdated LDP cell


def test_stat_gives_mean_and_sample_std_and_drops_a_zero_spread() -> None:
    assert stat("final_accuracy", [0.7, 0.8, 0.9]) == "80.0 ± 10.0 (3)"
    assert stat("final_accuracy", [0.75]) == "75.0"
    assert stat("final_accuracy", []) == "–"
    # a setting every seed ran at, summed in float: no "± 2.7e-16"
    assert (
        stat("epsilon_cumulative", [1.4652311573405759, 1.465231157340576, 1.4652311573405759]) == "1.47 (3)"
    )
    assert stat("noise", [14.9, 14.9], with_n=False) == "14.9"
    assert stat("rejected", [8, 9]) == "8.5 ± 0.7 (2)" and stat("rejected", [4, 4]) == "4 (2)"


def test_a_cell_another_experiment_already_ran_is_taken_from_there_not_run_twice(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    first = FakeSimulate()
    run_experiment(config, tmp_path / "runs", runner=first, echo=lambda _: None)
    # another experiment: one cell the same federation (the default aggregation spelled out, and
    # `method` at simulate's default), one with another train_limit, which must run
    other, _ = _config(
        tmp_path,
        """
name: other
title: "Another grid"
base: {dataset: sst2, clients: 10, rounds: 2, train_limit: 200, aggregation: fedavg}
grid:
  malicious: [1, 2]
  method: [prompt_tuning]
extra_cells:
  - {malicious: 0, train_limit: 300}
seeds: [0]
table: {rows: [malicious], metrics: [final_accuracy]}
""",
    )
    fake = FakeSimulate()
    statuses = run_experiment(other, tmp_path / "runs", runner=fake, echo=lambda _: None)
    assert all(s["status"] == "done" for s in statuses)
    ran = [Path(a[a.index("--out") + 1]).name for a in fake.calls]
    assert ran == ["malicious-0_method-none_train-limit-300_seed-0"]  # the fedavg cells were taken, not run
    twin = tmp_path / "runs/other/malicious-1_method-prompt-tuning_seed-0"
    meta = json.loads((twin / "cell.json").read_text())
    assert meta["same_as"] == "demo/malicious-1_aggregation-fedavg_seed-0" and meta["wall_seconds"] == 0.0
    records = collect(other, tmp_path / "runs")
    assert [r.get("same_as") is not None for r in records] == [False, True, True]
    assert records[1]["metrics"]["final_accuracy"] == pytest.approx(0.7)


def test_a_cell_from_another_starting_prompt_or_with_other_options_is_not_a_twin(tmp_path: Path) -> None:
    config, _ = _config(tmp_path)
    run_experiment(config, tmp_path / "runs", runner=FakeSimulate(), echo=lambda _: None)
    folder = tmp_path / "runs/demo/malicious-1_aggregation-fedavg_seed-0"
    meta = json.loads((folder / "cell.json").read_text())
    assert runner.find_twin(tmp_path / "runs", "other", meta["options"], None) == folder
    assert runner.find_twin(tmp_path / "runs", "demo", meta["options"], None) is None  # not its own
    assert runner.find_twin(tmp_path / "runs", "other", {**meta["options"], "rounds": 3}, None) is None
    (folder / "cell.json").write_text(json.dumps({**meta, "start_sha256": "another prompt"}))
    assert runner.find_twin(tmp_path / "runs", "other", meta["options"], None) is None


def test_options_by_data_set_reach_that_data_sets_cells_only_and_keep_the_ids(tmp_path: Path) -> None:
    config, _ = _config(
        tmp_path,
        """
name: per-data
title: "Per data set"
base: {clients: 4, template: "{text} It was [MASK]."}
grid:
  dataset: [sst2, twitter]
by_dataset:
  sst2: {template: "Review: {text} Sentiment: [MASK]", verbalizer: "negative;positive"}
seeds: [0]
table: {rows: [dataset], metrics: [final_accuracy]}
""",
    )
    cells = {c.id: c.options for c in expand(config)}
    assert set(cells) == {"dataset-sst2_seed-0", "dataset-twitter_seed-0"}
    assert cells["dataset-sst2_seed-0"]["template"] == "Review: {text} Sentiment: [MASK]"
    assert cells["dataset-sst2_seed-0"]["verbalizer"] == "negative;positive"
    assert cells["dataset-twitter_seed-0"]["template"] == "{text} It was [MASK]."
    assert "verbalizer" not in cells["dataset-twitter_seed-0"]
    fake = FakeSimulate()
    run_experiment(
        config,
        tmp_path / "runs",
        runner=lambda a, log: fake([*a, "--malicious", "0"], log),
        echo=lambda _: None,
    )
    sst2 = next(a for a in fake.calls if "dataset-sst2_seed-0" in a[a.index("--out") + 1])
    assert sst2[sst2.index("--template") + 1] == "Review: {text} Sentiment: [MASK]"
