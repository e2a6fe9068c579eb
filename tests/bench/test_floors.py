"""The floors table from literal result documents: ratios, spread, and what counts as met."""

from __future__ import annotations

import json
from pathlib import Path

from bench import floors


def _meets(v: float) -> bool:
    return v <= 1.5


def test_verdict_needs_three_repeats_and_every_one_to_call_a_floor_met() -> None:
    assert floors.verdict([1.2], _meets, repeated=False) == "1 run, repeats pending"
    assert floors.verdict([1.2, 1.3], _meets, repeated=True) == "2 runs, repeats pending"
    assert floors.verdict([1.2, 1.3, 1.4], _meets, repeated=True) == "met (3 of 3 repeats)"
    assert floors.verdict([1.2, 1.3, 1.9], _meets, repeated=True) == "median met, 2 of 3 repeats"
    assert floors.verdict([1.2, 1.8, 1.9], _meets, repeated=True) == "not met (1 of 3 repeats)"
    assert floors.verdict([], _meets, repeated=True) == "no result"


def _run(cpu_ms: float, delivery: float, rounds: float, errors: int = 0, load: float = 1.0) -> dict:
    return {
        "cpu_ms_per_request": cpu_ms,
        "train_delivery_s": {"p99": delivery},
        "rounds_per_min": rounds,
        "errors": errors,
        "loadavg_start": [load, 0.0, 0.0],
        "loadavg_end": [load + 0.5, 0.0, 0.0],
    }


def _ingest_doc(rows: list[tuple[float, float, float, int]], previous: bool = True) -> dict:
    """Per repeat, this build's sqlite (CPU ms per request, delivery p99 s, rounds/min, errors); the
    previous build took twice the CPU and delivery time and half the rounds; the null app 0.3 ms,
    1 s and 9 rounds a minute."""
    repeats = []
    for i, (cpu, delivery, rounds, err) in enumerate(rows):
        row = _run(cpu, delivery, rounds, err, load=1.0 + i)
        runs = {"null": _run(0.3, 1.0, 9.0, load=1.0 + i), "sqlite": row}
        if previous:
            runs["sqlite@previous"] = _run(2 * cpu, 2 * delivery, rounds / 2, load=1.0 + i)
            row["vs_previous"] = {"cpu_ms_per_request": 0.5, "train_delivery_p99": 0.5, "rounds_per_min": 2.0}
        repeats.append({"repeat": i, "runs": runs})
    point = {"k": 1000, "c": 1.0, "hidden": 384, "repeats": repeats}
    settings = {"backends": ["sqlite"], "previous": {"commit": "abc1234"} if previous else None}
    return {"settings": settings, "points": [point], "machine": {"loadavg": [3.0, 0, 0]}}


def test_ingest_floors_are_absolute_with_the_previous_build_s_ratio_and_the_null_app_beside() -> None:
    doc = _ingest_doc([(1.2, 4.0, 7.0, 0), (1.4, 4.5, 6.5, 0), (1.3, 3.0, 8.0, 0)])
    cpu, delivery, rounds = floors.ingest_floors(doc)
    assert cpu.status == "met (3 of 3 repeats)" and cpu.runs == "3 repeats"
    assert cpu.figure == "1.30 ms, errors 0"
    assert cpu.baseline == "previous build (abc1234) 2.60 ms; null app 0.30 ms"
    assert cpu.ratio == 0.5 and cpu.spread == (0.5, 0.5) and cpu.load == "1.0–3.5"
    assert delivery.status == "met (3 of 3 repeats)" and delivery.figure == "4.00 s, errors 0"
    assert rounds.status == "met (3 of 3 repeats)" and rounds.ratio == 2.0
    assert rounds.baseline.startswith("previous build (abc1234) 3.5 rounds/min")


def test_an_error_fails_its_repeat_whatever_the_figures() -> None:
    doc = _ingest_doc([(1.2, 4.0, 7.0, 0), (1.4, 4.5, 6.5, 2), (1.3, 6.0, 5.0, 0)])
    cpu, delivery, rounds = floors.ingest_floors(doc)
    assert cpu.status == "median met, 2 of 3 repeats" and "errors 2" in cpu.figure
    assert delivery.status == "not met (1 of 3 repeats)"  # 4.0 s, the error, 6.0 s
    assert rounds.status == "not met (1 of 3 repeats)"


def test_one_repeat_is_never_met_and_a_file_without_the_previous_build_has_no_ratio() -> None:
    doc = _ingest_doc([(1.0, 1.0, 10.0, 0)], previous=False)
    cpu, delivery, rounds = floors.ingest_floors(doc)
    assert cpu.status == "1 run, repeats pending" and cpu.ratio is None and cpu.spread is None
    assert cpu.baseline == "null app 0.30 ms"
    text = floors.table([cpu, delivery, rounds])
    assert "met" not in text.replace("repeats pending", "")


def test_comm_aggregation_worker_and_e2e_floors(tmp_path: Path) -> None:
    machine = {"machine": {"loadavg": [1.0, 1.0, 1.0]}}
    comm = {"rows": [{"model": "all-MiniLM-L6-v2", "method": "prompt_tuning", "wire_total": 1020,
                      "raw_plus_headers": 1000, "ratio_to_raw_plus_headers": 1.02,
                      "repeat_ratios": [1.02, 1.03, 1.02]}], **machine}  # fmt: skip
    fed = {"seconds": 0.1, "time_ratio": 0.5, "repeat_ratios": [0.5, 2.5, 0.6]}
    agg = {"results": [{"k": 10000, "numpy": {"seconds": 0.2}, "rules": {"fedavg": fed}}], **machine}
    worker = {
        "engine_steps_per_s": 1.0,
        "bare_steps_per_s": 1.0,
        "ratio": 1.0,
        "paired_ratios": [1.0, 0.9, 1.1],
    }
    rep = {"simulate": {"simulate_wall_s": 300.0, "loadavg_start": [1.0], "loadavg_end": [1.0]},
           "train-local": {"wall_s": 100.0, "loadavg_start": [1.0], "loadavg_end": [1.0]},
           "vs_train_local": {"wall": 3.0}}  # fmt: skip
    e2e = {"simulate_wall_s": 300.0, "repeats": [rep], **machine}
    for name, doc in (("comm", comm), ("aggregation", agg), ("worker", {**worker, **machine}), ("e2e", e2e)):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    got = {f.source: f for f in floors.collect(tmp_path)}
    assert got["comm.json"].status == "met (3 of 3 repeats)" and got["comm.json"].spread == (1.02, 1.03)
    assert (
        got["aggregation.json"].ratio == 0.6
        and got["aggregation.json"].status == "median met, 2 of 3 repeats"
    )
    assert got["worker.json"].status == "median met, 2 of 3 repeats"
    assert got["e2e.json"].ratio == 3.0 and got["e2e.json"].status == "1 run, repeats pending"
    page = "a\n<!-- bench:floors -->\nold\n<!-- /bench:floors -->\nb\n"
    out = floors.render(page, tmp_path)
    assert "old" not in out and "| **1.0200×** |" in out and out.startswith("a\n") and out.endswith("b\n")


def test_scale_floor_takes_each_repeats_ratio_of_the_larger_k_to_the_first(tmp_path: Path) -> None:
    def run(k: int, seconds: float) -> dict:
        return {"clients": k, "federation_s": seconds, "loadavg_start": [1.0], "loadavg_end": [2.0]}

    repeats = [
        {"runs": [run(20, 100.0), run(100, 105.0)], "ratios": {"100": 1.05}},
        {"runs": [run(20, 100.0), run(100, 112.0)], "ratios": {"100": 1.12}},
        {"runs": [run(20, 110.0), run(100, 110.0)], "ratios": {"100": 1.0}},
    ]
    doc = {"sizes": [{"clients": 20, "fraction": 0.5}, {"clients": 100, "fraction": 0.1}], "repeats": repeats}
    (tmp_path / "scale.json").write_text(json.dumps(doc))
    (got,) = floors.collect(tmp_path)
    assert got.floor.startswith("K = 100 ÷ K = 20 at 10 clients per round")
    assert got.ratio == 1.05 and got.spread == (1.0, 1.12) and got.figure == "110 s"
    assert got.status == "median met, 2 of 3 repeats" and got.load == "1.0–2.0"


def test_a_scale_file_with_an_evaluation_policy_is_a_floor_of_its_own(tmp_path: Path) -> None:
    def run(k: int, seconds: float) -> dict:
        return {"clients": k, "federation_s": seconds, "loadavg_start": [1.0], "loadavg_end": [1.0]}

    sizes = [{"clients": 20, "fraction": 0.5}, {"clients": 100, "fraction": 0.1}]
    every = {
        "sizes": sizes,
        "settings": {"evaluators": None},
        "repeats": [{"runs": [run(20, 100.0), run(100, 120.0)], "ratios": {"100": 1.2}}] * 3,
    }
    policy = {"sizes": sizes, "settings": {"evaluators": 10},
              "repeats": [{"runs": [run(20, 100.0), run(100, 104.0)], "ratios": {"100": 1.04}}] * 3}  # fmt: skip
    (tmp_path / "scale.json").write_text(json.dumps(every))
    (tmp_path / "scale-evaluators.json").write_text(json.dumps(policy))
    got = {f.source: f for f in floors.collect(tmp_path)}
    assert got["scale.json"].status == "not met (0 of 3 repeats)"
    assert got["scale.json"].floor.startswith(
        "K = 100 ÷ K = 20 at 10 clients per round, every client evaluating"
    )
    assert got["scale-evaluators.json"].floor.startswith(
        "K = 100 ÷ K = 20 at 10 clients per round, 10 evaluators"
    )
    assert (
        got["scale-evaluators.json"].ratio == 1.04
        and got["scale-evaluators.json"].status == "met (3 of 3 repeats)"
    )


def test_scale_table_shows_each_repeats_runs_and_ratio() -> None:
    from bench import report

    def run(k: int, seconds: float) -> dict:
        return {"clients": k, "federation_s": seconds, "final_accuracy": 0.75, "peak_rss_mib": 2048.0}

    doc = {
        "sizes": [{"clients": 20, "fraction": 0.5}, {"clients": 100, "fraction": 0.1}],
        "settings": {"partition": "label:1.0", "rounds": 6, "local_steps": 10, "verbalizer": "a;b", "seed": 0,
                     "evaluators": None},
        "repeats": [{"repeat": 0, "order": [100, 20], "runs": [run(20, 100.0), run(100, 104.0)],
                     "ratios": {"100": 1.04}}],
        "command": "python -m bench.scale", "finished_at": "t",
        "machine": {"loadavg": [1.0, 1.0, 1.0], "cpus": 2, "cpu_model": "x", "memory_gib": 1, "commit": "c"},
    }  # fmt: skip
    text = report.scale_table(doc)
    assert (
        "| 1 | K = 100, K = 20 | 100.0 s (75.0 %, 2,048 MiB) | 104.0 s (75.0 %, 2,048 MiB) | **1.040×** |"
        in text
    )
    assert "every client evaluating" in text
