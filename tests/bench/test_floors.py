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


def _run(p99: float, delivery: float, errors: int = 0, load: float = 1.0) -> dict:
    return {
        "upload_s": {"p99": p99},
        "train_delivery_s": {"p99": delivery},
        "errors": errors,
        "loadavg_start": [load, 0.0, 0.0],
        "loadavg_end": [load + 0.5, 0.0, 0.0],
    }


def _ingest_doc(rows: list[tuple[float, float, float, float, int]]) -> dict:
    """(null p99, sqlite p99, null delivery, sqlite delivery, sqlite errors) per repeat."""
    repeats = []
    for i, (n99, s99, nd, sd, err) in enumerate(rows):
        null, row = _run(n99, nd, load=1.0 + i), _run(s99, sd, err, load=1.0 + i)
        row["vs_null"] = {"upload_p99": s99 / n99, "train_delivery_p99": sd / nd}
        repeats.append({"repeat": i, "runs": {"null": null, "sqlite": row}})
    point = {"k": 1000, "c": 1.0, "hidden": 384, "repeats": repeats}
    return {"settings": {"backends": ["sqlite"]}, "points": [point], "machine": {"loadavg": [3.0, 0, 0]}}


def test_ingest_floors_are_same_repeat_ratios_with_their_spread() -> None:
    doc = _ingest_doc([(0.2, 0.24, 10.0, 11.0, 0), (1.0, 1.3, 12.0, 13.0, 0), (0.5, 0.6, 11.0, 12.0, 0)])
    upload, delivery = floors.ingest_floors(doc)
    assert upload.ratio == 1.2 and upload.spread == (1.2, 1.3)
    assert upload.status == "met (3 of 3 repeats)" and upload.runs == "3 repeats"
    assert upload.figure == "p99 600 ms, errors 0" and upload.baseline == "null app p99 500 ms"
    assert upload.load == "1.0–3.5"
    assert delivery.status == "met (3 of 3 repeats)" and delivery.spread[1] < 1.2


def test_an_error_fails_its_repeat_whatever_the_latency() -> None:
    doc = _ingest_doc([(0.2, 0.24, 10.0, 11.0, 0), (1.0, 1.3, 12.0, 13.0, 2), (0.5, 0.6, 11.0, 15.0, 0)])
    upload, delivery = floors.ingest_floors(doc)
    assert upload.status == "median met, 2 of 3 repeats" and "errors 2" in upload.figure
    assert delivery.status == "median met, 2 of 3 repeats"


def test_a_file_without_repeats_is_never_met() -> None:
    stats = {"p50": 0.01, "p99": 0.2}
    row = {"backend": "sqlite", "k": 1000, "c": 1.0, "prompt": [20, 384], "upload_s": stats}
    row |= {"poll_delivery_s": stats, "errors": 0, "vs_null": {"upload_p99": 1.1}}
    null = {"k": 1000, "hidden": 384, "upload_s": {"p99": 0.18}}
    doc = {"rows": [row], "null": [null], "settings": {}, "machine": {"loadavg": [2.5, 0, 0]}}
    upload, delivery = floors.ingest_floors({**doc, "settings": {"backends": ["sqlite"]}})
    assert upload.ratio == 1.1 and upload.status == "1 run, repeats pending" and upload.spread is None
    assert delivery.ratio is None and delivery.status == "baseline and repeats pending"
    text = floors.table([upload, delivery])
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
