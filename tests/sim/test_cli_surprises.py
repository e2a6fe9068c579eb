"""The CLI surprises of issue 34, each pinned: simulate's --out guard, ... (no process is started)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.shared.contract import FederationStatus
from fedprompt.sim.options import SimulateOptions
from fedprompt.sim.outdir import OutState, check_out, differences, recorded_options, wipe
from fedprompt.sim.simulate import simulate_command
from typer.testing import CliRunner

from tests.helpers import simulate_in_process

runner = CliRunner()


def _options(**over: Any) -> SimulateOptions:
    """simulate's options as the command's defaults would make them, with `over` changed."""
    params = inspect.signature(simulate_command).parameters
    return SimulateOptions(**({name: p.default for name, p in params.items()} | over))


def _run_folder(out: Path, opts: SimulateOptions, lr: float = 0.01) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    setup = {"federation_id": 1, "clients": opts.clients, "options": recorded_options(opts), "lr": lr}
    (out / "simulation.json").write_text(json.dumps(setup))
    return out


def _simulate(*args: str) -> Any:
    return simulate_in_process("--dataset", "sst2", *args)


def test_an_out_that_holds_a_run_with_other_options_is_refused_saying_what_differs(tmp_path: Path) -> None:
    out = _run_folder(tmp_path / "sim", _options(dataset="sst2", lr=0.01, clients=4))
    before = (out / "simulation.json").read_text()
    done = _simulate("--lr", "0.05", "--clients", "3", "--out", str(out))
    text = " ".join(done.output.split())
    assert done.exit_code == 2, done.output
    assert f"{out} holds a run with clients 4, lr 0.01; this command has clients 3, lr 0.05" in text
    assert "--resume" in text and "--force" in text
    assert "Traceback" not in text
    assert (out / "simulation.json").read_text() == before  # nothing touched, nothing started
    assert sorted(p.name for p in out.iterdir()) == ["simulation.json"]


def test_resume_continues_only_the_same_options_and_only_a_run_that_exists(tmp_path: Path) -> None:
    out = _run_folder(tmp_path / "sim", _options(dataset="sst2", rounds=3))
    with pytest.raises(ValueError, match="rounds 3; this command has rounds 5"):
        check_out(_options(dataset="sst2", rounds=5, resume=True), out)
    assert check_out(_options(dataset="sst2", rounds=3, resume=True), out) is OutState.CONTINUE
    assert check_out(_options(dataset="sst2", rounds=3, parallel=1, device="cpu"), out) is OutState.CONTINUE
    with pytest.raises(ValueError, match="holds no run to continue"):
        check_out(_options(resume=True), tmp_path / "empty")
    assert check_out(_options(), tmp_path / "empty") is OutState.NEW


def test_an_unset_lr_matches_the_lr_the_run_resolved() -> None:
    stored = recorded_options(_options(lr=None))
    assert differences(stored, recorded_options(_options(lr=0.01)), stored_lr=0.01) == []
    assert differences(stored, recorded_options(_options(lr=0.3)), stored_lr=0.01) == ["lr"]


def test_an_option_newer_than_the_run_matches_it_at_its_default() -> None:
    stored = recorded_options(_options(drift_correction="none"))
    del stored["drift_correction"]  # a run made before the option existed: it ran with none
    defaults = {"drift_correction": "none"}
    assert differences(stored, recorded_options(_options(drift_correction="none")), None, defaults) == []
    changed = recorded_options(_options(drift_correction="scaffold"))
    assert differences(stored, changed, None, defaults) == ["drift_correction"]
    today = recorded_options(_options())  # today's default is not what that run ran with
    assert differences(stored, today, None, defaults) == ["drift_correction"]


def test_above_ten_clients_the_first_ten_evaluate_unless_evaluators_is_given() -> None:
    assert _options(clients=10).evaluators is None  # every client evaluates its share
    assert _options(clients=11).evaluators == 10
    assert _options(clients=100, evaluators=3).evaluators == 3
    assert _options(clients=100, evaluators=100).evaluators == 100
    # a run made before this default, every client of 100 evaluating, is another run
    stored = recorded_options(_options(clients=100))
    stored["evaluators"] = None
    assert differences(stored, recorded_options(_options(clients=100)), None) == ["evaluators"]


def test_a_finished_run_rerun_shows_its_results_and_keeps_its_wall_seconds(tmp_path: Path) -> None:
    opts = _options(dataset="sst2", rounds=1)
    out = _run_folder(tmp_path / "sim", opts)
    results = {
        "spec": {"rounds": 1},
        "rounds": [{"round": 1, "accuracy": 0.8}],
        "initial_accuracy": 0.5,
        "final_accuracy": 0.8,
        "total_bytes_up": 1024,
        "total_bytes_down": 2048,
        "wall_seconds": 123.0,
    }
    (out / "results.json").write_text(json.dumps(results))
    before = (out / "results.json").read_text()
    done = _simulate("--rounds", "1", "--out", str(out))
    assert done.exit_code == 0, done.output
    assert "finished" in done.output and "done in 123s" in done.output
    assert (out / "results.json").read_text() == before


def test_force_deletes_only_what_simulate_wrote(tmp_path: Path) -> None:
    out = _run_folder(tmp_path / "sim", _options())
    for name in ("results.json", "fedprompt.db", "notes.txt"):
        (out / name).write_text("x")
    (out / "logs").mkdir()
    (out / "logs" / "coordinator.log").write_text("x")
    assert sorted(wipe(out)) == ["fedprompt.db", "logs", "results.json", "simulation.json"]
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_resume_and_force_together_are_refused(tmp_path: Path) -> None:
    done = _simulate("--resume", "--force", "--out", str(tmp_path / "x"))
    assert done.exit_code == 2 and "exclude each other" in done.output


# -- an interrupted baseline: what it measured, labelled partial, no traceback, its own time -------

PARTIAL_TRAIN_LOCAL = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
report = {"status": "partial", "final_accuracy": None, "initial_accuracy": 0.5, "steps_done": 7,
          "last_evaluation": {"step": 0, "accuracy": 0.5}, "stopped": {"signal": "SIGTERM", "at_step": 7}}
open(out, "w").write(json.dumps(report))
sys.exit(143)
"""


def _baseline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> dict[str, Any]:
    import sys

    from fedprompt.shared.spec import FederationSpec
    from fedprompt.sim import baseline

    monkeypatch.setattr(
        baseline.TrainLocal, "argv", lambda self: [sys.executable, "-c", script, "--out", str(self.out)]
    )
    return baseline.run_baseline(tmp_path, tmp_path / "data", FederationSpec(), 40, None, None)


def test_a_baseline_stopped_by_sigterm_is_partial_with_what_it_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    record = _baseline(monkeypatch, tmp_path, PARTIAL_TRAIN_LOCAL)
    assert record["status"] == "partial" and record["interrupted"] == "stopped by SIGTERM"
    assert record["accuracy"] is None  # never the start figure as a final one
    assert record["steps_done"] == 7 and record["last_evaluation"] == {"step": 0, "accuracy": 0.5}
    killed = _baseline(monkeypatch, tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert killed["status"] == "partial" and killed["interrupted"] == "killed by SIGTERM"


def test_results_with_an_interrupted_baseline_are_written_and_labelled_partial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedprompt.sim.results import round_records, write_results
    from fedprompt.sim.tables import print_summary

    from tests.sim.test_simulate_parts import SPEC, _round

    base = {
        "steps": 40,
        "accuracy": None,
        "seconds": 30.0,
        "status": "partial",
        "interrupted": "stopped by SIGTERM",
    }
    base |= {"steps_done": 7, "last_evaluation": {"step": 0, "accuracy": 0.5}}
    extra = {"status": "partial", "interrupted": "the baseline (stopped by SIGTERM)", "baseline": base}
    records = round_records([_round(1)], SPEC)
    results = write_results(tmp_path, SPEC, records, {"accuracy": 0.5}, 12.0, extra)
    assert {"results.json", "rounds.csv", "accuracy.png"} <= {p.name for p in tmp_path.iterdir()}
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["status"] == "partial" and stored["wall_seconds"] == 12.0  # the baseline's 30 s apart
    print_summary(results, tmp_path)
    text = " ".join(capsys.readouterr().out.split())
    assert "done in 12s (the federation)" in text
    assert (
        "centralised baseline: partial (stopped by SIGTERM in 30s, 7 of 40 steps; last measured 50.0 % at step 0)"
        in text
    )
    assert "Traceback" not in text


# -- own data: named after its folder (or --data-name), a round-0 row, `fedprompt train-local` -----


@pytest.mark.parametrize(
    ("path", "explicit", "name"),
    [
        ("reviews/train.csv", None, "reviews"),
        ("shop/data.jsonl.gz", None, "shop"),
        ("reviews/tweets.csv", None, "tweets"),
        ("reviews/train.csv", "my-reviews", "my-reviews"),
    ],
)
def test_own_data_is_named_after_its_folder_or_data_name(path: str, explicit: str | None, name: str) -> None:
    from fedprompt.worker.naming import own_data_name

    assert own_data_name(path, explicit) == name


def test_simulate_names_a_train_csv_after_its_folder(tmp_path: Path) -> None:
    from fedprompt.sim.data_options import resolve_data

    folder = tmp_path / "reviews"
    folder.mkdir()
    rows = ["text,label"] + [
        f"{'good fine great' if i % 2 else 'bad awful poor'} {i},{i % 2}" for i in range(40)
    ]
    (folder / "train.csv").write_text("\n".join(rows) + "\n")
    dataset = resolve_data(
        _options(dataset=str(folder / "train.csv"), verbalizer="bad;good"), tmp_path / "out"
    )
    assert dataset.name == "reviews" and dataset.folder == tmp_path / "out" / "data" / "reviews"
    named = resolve_data(
        _options(dataset=str(folder / "train.csv"), verbalizer="bad;good", data_name="shop"), tmp_path / "out"
    )
    assert named.name == "shop"


def test_rounds_csv_starts_with_round_0_the_starting_prompt(tmp_path: Path) -> None:
    import csv

    from fedprompt.sim.results import round_records, write_results
    from fedprompt.sim.tables import row_table

    from tests.sim.test_simulate_parts import SPEC, _round

    initial = {"accuracy": 0.583, "loss": 0.7, "clients": 3, "num_samples": 30}
    write_results(tmp_path, SPEC, round_records([_round(1), _round(2)], SPEC), initial, 1.0, {})
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open()))
    assert [r["round"] for r in rows] == ["0", "1", "2"]
    assert (
        float(rows[0]["accuracy"]) == 0.583 and rows[0]["participants"] == "0" and rows[0]["bytes_up"] == "0"
    )
    from fedprompt.sim.results import initial_record

    start = initial_record(initial)
    assert start is not None and row_table(start, True).row_count == 1


def test_fedprompt_train_local_is_the_workers_command() -> None:
    from fedprompt.sim import operator_cli

    operator_cli.register_all()
    done = runner.invoke(operator_cli.app, ["train-local", "-h"], env={"COLUMNS": "200"})
    assert done.exit_code == 0, done.output
    assert "--steps" in done.output and "--data-name" in done.output and "--threads" in done.output


# -- fedprompt demo: the Makefile's demo settings as defaults, each one overridable -------------


def test_demo_runs_simulate_with_the_demo_settings_and_takes_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fedprompt.sim import operator_cli, simulate

    operator_cli.register_all()
    seen: list[SimulateOptions] = []
    monkeypatch.setattr(simulate, "simulate", seen.append)
    done = runner.invoke(operator_cli.app, ["demo"])
    assert done.exit_code == 0, done.output
    demo = seen[-1]
    assert (demo.dataset, demo.clients, demo.fraction, demo.rounds, demo.local_steps) == (
        "sst2",
        4,
        0.5,
        3,
        100,
    )
    assert (demo.lr, demo.train_limit, demo.seed, demo.out) == (0.01, 8000, 0, Path("runs/demo"))
    assert demo.verbalizer == "terrible,awful,bad;great,wonderful,good" and not demo.force
    assert demo.model == _options().model and demo.batch_size == _options().batch_size  # simulate's defaults
    out = tmp_path / "d"
    args = ["demo", "--rounds", "1", "--seed", "7", "--local-steps", "2", "--out", str(out), "--force"]
    assert runner.invoke(operator_cli.app, args).exit_code == 0
    assert (seen[-1].rounds, seen[-1].seed, seen[-1].local_steps, seen[-1].out, seen[-1].force) == (
        1,
        7,
        2,
        out,
        True,
    )


def test_make_demo_calls_fedprompt_demo() -> None:
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipe = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/fedprompt demo --seed $(SEED) --force" in recipe and "simulate" not in recipe


# -- simulate says where its coordinator, dashboard and admin token are, and logs its progress -----


def test_simulate_announces_the_dashboard_and_the_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import stat

    from fedprompt.sim.launch import announce

    path = announce("http://127.0.0.1:5555", tmp_path, "t" * 40)
    text = " ".join(capsys.readouterr().out.split())
    assert path.read_text().strip() == "t" * 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "dashboard http://127.0.0.1:5555/dashboard" in text and f"admin token in {path}" in text
    assert f"FEDPROMPT_ADMIN_TOKEN=$(cat {path})" in text and "t" * 40 not in text


def _status(state: str, enrolled: int, uploaded: int | None = None) -> FederationStatus:
    """A federation's status with `enrolled` clients; round 1 open with `uploaded` of 2 uploads unless None."""
    parts = [{"client_id": i + 1, "uploaded": i < (uploaded or 0)} for i in range(2)]
    open_round = {
        "round": 1,
        "attempt": 1,
        "state": "open",
        "base_version": 0,
        "result_version": None,
        "opened_at": 0.0,
        "deadline_at": 60.0,
        "closed_at": None,
        "closed_by": None,
        "seconds": None,
        "failure_reason": None,
        "participants": parts,
        "stats": None,
        "evaluation": None,
    }
    return FederationStatus.model_validate(
        {
            "id": 1,
            "name": "sim",
            "state": state,
            "paused": False,
            "current_round": 0 if uploaded is None else 1,
            "rounds_total": 1,
            "latest_version": 0,
            "clients": {"enrolled": enrolled, "active": enrolled, "available": enrolled},
            "open_round": None if uploaded is None else open_round,
            "latest": None,
            "spec": {},
            "created_at": 0.0,
        }
    )


class _Admin:
    """A coordinator's answers over time: waiting for clients, round 1 with its uploads, then done."""

    def __init__(self) -> None:
        from tests.sim.test_simulate_parts import _round

        waiting, more = _status("waiting", 1), _status("waiting", 2)
        running = [_status("running", 2, uploaded) for uploaded in (0, 1, 1)]
        done = _status("completed", 2)
        self.statuses = [waiting, waiting, more, *running, done]
        self.closed = [_round(1) | {"evaluation": {"accuracy": 0.7, "clients": 2, "num_samples": 20}}]

    def federation(self, fid: int) -> FederationStatus:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def rounds(self, fid: int) -> list[dict[str, Any]]:
        return self.closed if self.statuses[0].state == "completed" else []

    def clients(self, fid: int) -> list[dict[str, Any]]:
        training = {"phase": "training", "round": 1, "total_steps": 50}
        return [{"activity": training | {"step": 20}}, {"activity": training | {"step": 25}}]

    def evaluation(self, fid: int, version: int) -> dict[str, Any]:
        return {"accuracy": 0.5, "clients": 2, "num_samples": 20}

    def site_evaluations(self, fid: int, version: int) -> dict[str, Any]:
        return {"version": version, "sites": [], "spread": None}


class _Procs:
    peak_rss = 0

    def check(self) -> None:
        pass

    def rss_bytes(self) -> int:
        return 0


def test_without_a_terminal_simulate_logs_a_line_per_round_attempt_upload_and_local_steps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedprompt.sim import progress

    from tests.sim.test_simulate_parts import SPEC

    monkeypatch.setattr(progress.time, "sleep", lambda s: None)
    # the width a log gets (sim/tables.py), whatever COLUMNS was when this process first imported it
    monkeypatch.setattr(progress.console, "width", 160)
    records, initial = progress.follow(_Admin(), 1, {**SPEC, "rounds": 1}, 2, _Procs())  # type: ignore[arg-type]
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[:5] == [
        "waiting for clients: 1/2 enrolled",
        "waiting for clients: 2/2 enrolled",
        "round 1/1 attempt 1: 0/2 uploads",
        "round 1: 2 clients training, local steps 45/100",  # from their heartbeats, every 30 s at most
        "round 1/1 attempt 1: 1/2 uploads",
    ]
    table = [line.split() for line in lines[5:]]
    assert table[1][:3] == ["0", "0", "50.0"] and table[2][:3] == ["1", "3", "70.0"]  # round 0, then round 1
    assert [r["round"] for r in records] == [1] and initial == {
        "accuracy": 0.5,
        "clients": 2,
        "num_samples": 20,
    }


def test_a_simulation_of_many_clients_is_not_refused_by_the_per_address_enrolment_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedprompt.coordinator.config import Settings
    from fedprompt.sim.launch import Run

    monkeypatch.delenv("FEDPROMPT_ENROLMENT_RATE_LIMIT", raising=False)
    # every client enrols from loopback: 1,000 of them within the default 120 a minute were refused
    many = Run.prepare(_options(clients=1000), tmp_path / "many").env["FEDPROMPT_ENROLMENT_RATE_LIMIT"]
    few = Run.prepare(_options(clients=4), tmp_path / "few").env["FEDPROMPT_ENROLMENT_RATE_LIMIT"]
    assert (many, few) == ("2000/minute", "120/minute")
    assert Settings(admin_token="x" * 32, enrolment_rate_limit=many).enrolment_rate_limit == many
    monkeypatch.setenv("FEDPROMPT_ENROLMENT_RATE_LIMIT", "5/minute")  # an operator's own choice stays
    assert (
        Run.prepare(_options(clients=1000), tmp_path / "own").env["FEDPROMPT_ENROLMENT_RATE_LIMIT"]
        == "5/minute"
    )
