"""Each benchmark command runs at a tiny size and writes a result file BENCHMARKS.md can be built from."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from fedprompt.shared import wire
from fedprompt.shared.vocab import Method

from bench import aggregation, comm, e2e, ingest, report, scoring, secagg, worker


def _result(out: Path, name: str) -> dict:
    doc = json.loads((out / f"{name}.json").read_text())
    assert doc["benchmark"] == name
    assert len(doc["machine"]["loadavg"]) == 3 and doc["machine"]["cpus"] >= 1
    return doc


def test_aggregation_compares_every_rule_with_numpy(tmp_path: Path) -> None:
    aggregation.main(["--ks", "10", "--repeats", "1", "--out-dir", str(tmp_path)])
    doc = _result(tmp_path, "aggregation")
    (row,) = doc["results"]
    assert set(row["rules"]) >= {"fedavg", "median", "trimmed_mean", "krum", "multi_krum", "norm_bound"}
    assert all(r["time_ratio"] > 0 and r["peak_mib"] >= 0 for r in row["rules"].values())
    assert len(row["rules"]["fedavg"]["repeat_ratios"]) == 1
    assert row["service_fedavg"]["seconds"] > 0


def test_comm_counts_headers_and_bodies_on_the_wire(tmp_path: Path) -> None:
    comm.main(["--quick", "--repeats", "2", "--out-dir", str(tmp_path)])
    rows = _result(tmp_path, "comm")["rows"]
    assert sorted(r["method"] for r in rows) == sorted(Method)  # every method the spec offers
    pt = next(r for r in rows if r["method"] == "prompt_tuning")
    assert pt["tensor_bytes"] == 20 * 384 * 4
    # two prompt transfers (upload, evaluation download; training reuses the version evaluated)
    # plus JSON and headers, and not a third: the client does not fetch the same version twice
    assert pt["prompt_transfers"] == 2
    assert 2 * pt["tensor_bytes"] + pt["header_bytes"] < pt["wire_total"] < 3 * pt["tensor_bytes"]
    assert pt["header_bytes"] > 0 and pt["wire_total"] == pt["wire_up"] + pt["wire_down"]
    assert len(pt["repeat_ratios"]) == 2 and pt["repeat_ratios"][0] == pt["ratio_to_raw_plus_headers"]


def test_ingest_repeats_interleave_the_null_app_and_record_the_generator(tmp_path: Path) -> None:
    ingest.main(
        ["--grid", "4x1.0", "--hidden", "384", "--backends", "sqlite,null", "--repeats", "2",
         "--rounds", "1", "--train-s", "0", "--wait", "2", "--time-limit", "60", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    doc = _result(tmp_path, "ingest")
    assert doc["settings"]["repeats"] == 2 and doc["settings"]["backends"] == ["sqlite"]
    (point,) = doc["points"]
    assert [r["order"] for r in point["repeats"]] == [["null", "sqlite"], ["sqlite", "null"]]
    for rep in point["repeats"]:
        row, null = rep["runs"]["sqlite"], rep["runs"]["null"]
        assert row["errors"] == 0 and row["uploads"] == 4 and row["rounds_closed"] == 1
        # the null app runs the same rounds: its workers long-poll for their train task
        assert null["errors"] == 0 and null["uploads"] == 4 and null["rounds_closed"] == 1
        assert null["train_delivery_s"]["n"] == 4 and null["evaluate_delivery_s"]["n"] == 4
        assert row["vs_null"]["upload_p99"] == row["upload_s"]["p99"] / null["upload_s"]["p99"]
        for run in (row, null):
            gen = run["generator"]
            assert gen["cpu_s"] >= 0 and gen["loop_lag_s"]["n"] >= 1 and gen["connections"] >= 1
            assert gen["ramp_s"] > 0 and gen["startup_s"] > 0
            assert len(run["loadavg_start"]) == 3 and len(run["loadavg_end"]) == 3
    ratios = point["summary"]["sqlite"]["vs_null"]["upload_p99"]
    assert ratios["n"] == 2 and ratios["min"] <= ratios["median"] <= ratios["max"]
    assert point["summary"]["null"]["upload_p99"]["n"] == 2
    table = report.ingest_table(doc)
    assert "| null app |" in table and "| sqlite |" in table and "2 repeats" in table


@pytest.mark.postgres
def test_ingest_runs_two_replicas_behind_one_postgres_and_each_round_closes_once(tmp_path: Path) -> None:
    """100 workers in two groups of 50, one group per replica: the rounds one replica opens and closes
    reach the other's workers through the database, and no round is closed twice."""
    ingest.main(
        ["--grid", "100x1.0", "--hidden", "384", "--backends", "postgres", "--replicas", "2", "--repeats", "1",
         "--rounds", "2", "--train-s", "0.5", "--wait", "2", "--time-limit", "120", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    doc = _result(tmp_path, "ingest")
    assert doc["settings"]["replicas"] == 2
    row = doc["points"][0]["repeats"][0]["runs"]["postgres"]
    assert row["replicas"] == 2 and len(row["replica_peak_rss_mib"]) == 2
    assert row["errors"] == 0 and row["uploads"] == 200 and row["rounds_closed"] == 2
    assert row["closed_once"] is True and row["train_delivery_s"]["n"] == 200


def test_closed_once_needs_each_round_closed_by_exactly_one_attempt() -> None:
    closed = [
        {"round": 1, "state": "closed"},
        {"round": 2, "state": "failed"},
        {"round": 2, "state": "closed"},
    ]
    assert ingest.closed_once(closed, 2, latest=2)
    assert not ingest.closed_once(closed, 2, latest=1)  # a version lost
    assert not ingest.closed_once([*closed, {"round": 2, "state": "closed"}], 2, latest=2)  # closed twice
    assert not ingest.closed_once(closed[:1], 2, latest=1)  # a round never closed


@pytest.mark.slow
def test_worker_times_engine_and_bare_loop(tmp_path: Path) -> None:
    worker.main(
        [
            "--steps",
            "1",
            "--blocks",
            "1",
            "--train-limit",
            "32",
            "--max-length",
            "16",
            "--out-dir",
            str(tmp_path),
        ]
    )
    doc = _result(tmp_path, "worker")
    assert doc["engine_steps_per_s"] > 0 and doc["bare_steps_per_s"] > 0 and doc["ratio"] > 0
    assert len(doc["paired_ratios"]) == 1 and doc["ratio"] == doc["paired_ratios"][0]


def _fake_simulate_db(path: Path) -> None:
    """A round of two clients as the coordinator and the workers record it."""
    con = sqlite3.connect(path)
    con.executescript(
        "create table rounds (id, number, opened_at, closed_at, stats, base_version, state);"
        "create table updates (round_id, client_id, blob, metrics, created_at);"
        "create table evaluations (client_id, version, created_at);"
    )
    con.execute(
        "insert into rounds values (1, 1, 100.0, 120.0, ?, 0, 'closed')",
        (json.dumps({"aggregation_s": 0.5}),),
    )
    for cid, received, train, created in ((1, 102.0, 10.0, 114.0), (2, 101.0, 15.0, 118.0)):
        timing = {
            "task_received_at": received,
            "download_s": 0.5,
            "slot_wait_s": 1.0,
            "trained_at": received + 1.5 + train + 0.25,
        }
        blob = wire.encode({"p": np.zeros(2, np.float32)}, {"timing": timing})
        con.execute(
            "insert into updates values (1, ?, ?, ?, ?)", (cid, blob, json.dumps({"seconds": train}), created)
        )
        con.execute("insert into evaluations values (?, 0, ?)", (cid, 100.5))
    con.commit()
    con.close()


def test_scoring_trains_both_readouts_on_the_same_batches(tmp_path: Path) -> None:
    scoring.main(
        ["--checkpoints", "2,4", "--block", "2", "--train-limit", "32", "--eval-limit", "16",
         "--max-length", "16", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    doc = _result(tmp_path, "scoring")
    for name in ("tied-embeddings", "mean-pool"):
        assert [a["step"] for a in doc["accuracy"][name]] == [0, 2, 4]
        assert all(0.0 <= a["accuracy"] <= 1.0 for a in doc["accuracy"][name])
    assert len(doc["paired_ratios"]) == 2 and doc["speed_ratio_mean_pool_vs_tied"] > 0


def test_e2e_split_adds_up_to_the_round_wall_time(tmp_path: Path) -> None:
    _fake_simulate_db(tmp_path / "fedprompt.db")
    (rnd,) = e2e.split_rounds(tmp_path / "fedprompt.db")
    assert rnd["wall_s"] == 20.0
    assert sum(rnd["mean_s"].values()) == pytest.approx(20.0)
    assert rnd["mean_s"]["training"] == pytest.approx(12.5)
    assert rnd["mean_s"]["serialisation"] == pytest.approx(0.25)
    assert rnd["mean_s"]["aggregation"] == pytest.approx(0.5)


def test_report_fills_the_marked_tables(tmp_path: Path) -> None:
    aggregation.main(["--ks", "10", "--rules", "fedavg", "--repeats", "1", "--out-dir", str(tmp_path)])
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("intro\n<!-- bench:aggregation -->\nold\n<!-- /bench:aggregation -->\nkept\n")
    report.main(["--results", str(tmp_path), "--out", str(md)])
    text = md.read_text()
    assert "old" not in text and "| 10 |" in text and text.startswith("intro") and text.endswith("kept\n")


def test_secagg_runs_a_plain_and_a_secure_round_per_k(tmp_path: Path) -> None:
    secagg.main(["--k", "3", "--tokens", "2", "--hidden", "4", "--threads", "2", "--out-dir", str(tmp_path)])
    (run,) = _result(tmp_path, "secagg")["runs"]
    assert run["k"] == 3 and run["secure"]["k_neighbours"] == 2 and run["secure"]["t"] == 2
    assert set(run["secure"]["stage_bytes_up"]) == {"keys", "shares", "masked", "consistency", "unmask"}
    assert len(run["repeats"]) == 3
    assert run["secure_over_plain"]["bytes_up_per_client"] > 1
