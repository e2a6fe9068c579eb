"""The repeat logic of the benchmarks on literal inputs: the rotation, the spread over repeats, the null
app's rounds, the generator's own limits, the end-to-end baseline."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from pathlib import Path

import pytest

from bench import e2e, ingest, loadgen, scale
from bench.common import spread
from bench.null_server import Rounds


def test_the_order_rotates_so_each_system_goes_first_once() -> None:
    systems = ["null", "sqlite", "postgres"]
    orders = [ingest.rotation(systems, r) for r in range(4)]
    assert orders[:3] == [
        ["null", "sqlite", "postgres"],
        ["sqlite", "postgres", "null"],
        ["postgres", "null", "sqlite"],
    ]
    assert orders[3] == orders[0]


def test_spread_is_min_median_max_of_the_present_values() -> None:
    assert spread([3.0, None, 1.0, 2.0]) == {
        "n": 3,
        "min": 1.0,
        "median": 2.0,
        "max": 3.0,
        "values": [3.0, 1.0, 2.0],
    }
    assert spread([None])["median"] is None and spread([])["n"] == 0


def _run(p99: float, *, coordinator: bool, load: float = 1.0) -> dict:
    """One run's record: the null app's names its CPU and RSS cpu_s and peak_rss_mib, the coordinator's not."""
    stats = {"n": 10, "p50": p99 / 2, "p99": p99}
    own = (
        {"coordinator_cpu_s": 2.0, "coordinator_peak_rss_mib": 100.0}
        if coordinator
        else {"cpu_s": 1.0, "peak_rss_mib": 50.0}
    )
    return {
        **own,
        "upload_s": stats,
        "poll_delivery_s": stats,
        "train_delivery_s": stats,
        "download_s": stats,
        "uploads_per_s": 100.0,
        "uploads": 10,
        "errors": 0,
        "rounds_per_min": 5.0,
        "generator": {"cpu_s": 0.5, "loop_lag_s": {"p99": 0.001}, "ramp_s": 0.2, "startup_s": 0.4},
        "loadavg_start": [load, 0, 0],
        "loadavg_end": [load + 1, 0, 0],
    }


def test_each_ratio_is_to_the_null_app_of_the_same_repeat() -> None:
    repeats = []
    for null_p99, row_p99 in ((0.01, 0.012), (0.1, 0.11), (0.02, 0.05)):
        null, row = _run(null_p99, coordinator=False), _run(row_p99, coordinator=True)
        row["vs_null"] = ingest.compare(row, null)
        repeats.append({"runs": {"null": null, "sqlite": row}})
    summary = ingest.summarize(repeats)
    ratios = summary["sqlite"]["vs_null"]["upload_p99"]
    assert ratios["values"] == pytest.approx([1.2, 1.1, 2.5])
    assert (ratios["min"], ratios["median"], ratios["max"]) == pytest.approx((1.1, 1.2, 2.5))
    # the figure itself is the spread of the absolute p99s, the null app's as well
    assert summary["sqlite"]["upload_p99"]["max"] == pytest.approx(0.11)
    assert summary["null"]["upload_p99"]["min"] == pytest.approx(0.01)
    assert summary["sqlite"]["cpu_s"]["median"] == 2.0 and summary["null"]["cpu_s"]["median"] == 1.0
    assert summary["sqlite"]["loadavg_end"]["values"] == [2.0, 2.0, 2.0]
    assert summary["null"]["generator_lag_p99"]["median"] == 0.001


def test_backends_take_sqlite_and_postgres_and_drop_null() -> None:
    assert ingest._backends("sqlite,postgres,null") == ["sqlite", "postgres"]
    with pytest.raises(SystemExit, match="nul"):
        ingest._backends("sqlite,nul")


def test_the_null_app_runs_the_coordinators_rounds() -> None:
    rounds = Rounds(clients=2, rounds=2, fraction=0.5, seed=0)
    a, b = rounds.enrol(), rounds.enrol()
    assert rounds.history[0]["state"] == "open"  # opens once every expected client enrolled
    assert rounds.task(a)["kind"] == "evaluate" and rounds.task(a)["version"] == 0
    rounds.evaluate(a, 0)
    rounds.evaluate(b, 0)
    (chosen,) = rounds.selected
    other = b if chosen == a else a
    assert rounds.task(chosen)["kind"] == "train" and rounds.task(other) is None
    rounds.upload(other, 1)  # not selected: ignored
    assert rounds.latest == 0
    rounds.upload(chosen, 1)
    assert rounds.latest == 1 and rounds.history[0]["state"] == "closed"
    assert rounds.history[0]["result_version"] == 1 and rounds.history[1]["round"] == 2
    assert rounds.task(other) == {"kind": "evaluate", "round": 1, "version": 1, "sha256": "0" * 64}
    rounds.evaluate(a, 1)
    rounds.evaluate(b, 1)
    rounds.upload(next(iter(rounds.selected)), 2)
    rounds.evaluate(a, 2)
    assert rounds.completed and rounds.task(a)["kind"] == "done"


def test_the_ticker_records_how_late_the_loop_woke() -> None:
    async def go() -> list[float]:
        lags: list[float] = []
        stop = asyncio.Event()
        tick = asyncio.create_task(loadgen.ticker(lags, stop, interval=0.005))
        await asyncio.sleep(0.03)
        stop.set()
        await tick
        return lags

    lags = asyncio.run(go())
    assert len(lags) >= 2 and all(lag >= 0 for lag in lags)


def test_generator_limits_from_literal_samples() -> None:
    limits = loadgen.generator_limits([0.0, 0.01, 0.5], [0.001, 0.003], [100.2, 100.7], 100.0, 2.0, 8.0)
    assert limits["cpu_s"] == 2.0 and limits["cpu_share"] == 0.25
    assert limits["loop_lag_s"]["max"] == 0.5 and limits["loop_lag_s"]["n"] == 3
    assert limits["connections"] == 2 and limits["ramp_s"] == pytest.approx(0.7)


def test_e2e_baseline_trains_the_federations_steps_in_train_local() -> None:
    args = Namespace(clients=10, rounds=2, local_steps=5, train_limit=2000, eval_limit=100)
    cmd = e2e.baseline_command(args, Path("out.json"))
    assert cmd[1] == "train-local" and cmd[cmd.index("--steps") + 1] == "100"
    sim = e2e.simulate_command(args, Path("sim"))
    for flag in ("--train-limit", "--eval-limit"):
        assert cmd[cmd.index(flag) + 1] == sim[sim.index(flag) + 1]
    ratios = e2e.overhead(
        {"simulate_wall_s": 300.0, "rounds_wall_s": 200.0}, {"wall_s": 100.0, "train_s": 80.0}
    )
    assert ratios == {"wall": 3.0, "rounds_vs_training": 2.5}


def test_scale_runs_the_same_federation_at_each_k_and_c() -> None:

    assert scale.parse_sizes("20:0.5,100:0.1") == [(20, 0.5), (100, 0.1)]
    args = Namespace(rounds=6, local_steps=10, partition="label:1.0", seed=0, evaluators=10)
    small = scale.simulate_command(args, 20, 0.5, Path("a"))
    large = scale.simulate_command(args, 100, 0.1, Path("b"))
    differ = {i for i, (x, y) in enumerate(zip(small, large, strict=True)) if x != y}
    assert [small[i] for i in sorted(differ)] == ["20", "0.5", "a"] and small[-2:] == ["--evaluators", "10"]
    assert scale.simulate_command(args, 4, 1.0, Path("c"))[-2:] == ["--evaluators", "4"]  # never above K
    args.evaluators = 0  # every client evaluates its share
    assert scale.simulate_command(args, 100, 0.1, Path("b"))[-2:] == ["--evaluators", "100"]
