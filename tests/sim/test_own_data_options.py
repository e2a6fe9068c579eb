"""simulate's data options without processes: a folder or file of one's own, its template and label words,
the name results.json records, and per-class figures in the round table, results.json and rounds.csv."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fedprompt.sim.data_options import resolve_data, shard_lines
from fedprompt.sim.options import build_spec
from fedprompt.sim.results import run_facts
from fedprompt.worker.data import DataError, LabelWordError, MissingDataset, builtin_datasets_dir
from fedprompt.worker.data.partition import PartitionError

from tests import fixtures

MODEL = "all-MiniLM-L6-v2"


def _opts(tmp_path: Path, **over: Any) -> SimpleNamespace:
    base = {
        "dataset": "sst2",
        "test_data": None,
        "text_column": "text",
        "text_b_column": None,
        "label_column": "label",
        "labels": None,
        "template": None,
        "verbalizer": None,
        "model": MODEL,
        "out": tmp_path / "run",
        "clients": 3,
        "partition": "iid",
        "seed": 0,
        "train_limit": 90,
        "eval_limit": None,
    }
    return SimpleNamespace(**(base | over))


def _own_folder(root: Path, name: str, labels: list[str]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"task": "single", "labels": labels}))
    rows = [{"text": f"message {i}", "label": i % 2} for i in range(40)]
    for split in ("train", "test"):
        with gzip.open(folder / f"{split}.jsonl.gz", "wt") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return folder


def test_a_folder_of_ones_own_with_template_and_verbalizer_runs_and_keeps_its_name(tmp_path: Path) -> None:
    folder = _own_folder(tmp_path, "mail", ["ham", "spam"])
    opts = _opts(tmp_path, dataset=str(folder), template="{text} This is [MASK].", verbalizer="normal;junk")

    dataset = resolve_data(opts, opts.out)

    assert (dataset.folder, dataset.name, dataset.labels) == (folder, "mail", ("ham", "spam"))
    assert dataset.template == "{text} This is [MASK]." and dataset.verbalizer == (("normal",), ("junk",))
    spec = build_spec(
        dataset_name=dataset.name, task=dataset.task, model=MODEL, clients=3, fraction=1.0, rounds=2,
        local_steps=5, batch_size=4, lr=0.3, num_virtual_tokens=4, max_length=32, seed=0, round_deadline=60.0,
        template=dataset.template, verbalizer=[list(w) for w in dataset.verbalizer], hidden_size=8,
        fingerprint=None,
    )  # fmt: skip
    assert spec.name == "simulate-mail" and spec.verbalizer == [["normal"], ["junk"]]
    facts = run_facts(spec.model_dump(mode="json"), {"federation_id": 1, "dataset": str(folder), "clients": 3, "partition": "iid"}, parallel=1, cores=1, device="cpu")  # fmt: skip
    assert facts["dataset"] == "mail" and facts["labels"] == ["ham", "spam"]


def test_a_folder_of_ones_own_without_label_words_gets_the_one_piece_error(tmp_path: Path) -> None:
    folder = _own_folder(tmp_path, "mail", ["ham", "spam"])

    with pytest.raises(LabelWordError, match=r"label 'spam' is 2 word pieces"):
        resolve_data(_opts(tmp_path, dataset=str(folder)), tmp_path / "run")


def test_a_csv_is_packed_into_the_run_folder_with_its_held_out_split(tmp_path: Path) -> None:
    rows = fixtures.rows("sst2", "train", 100)
    path = tmp_path / "reviews.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence", "sentiment"])
        writer.writerows([r["text"], ["negative", "positive"][r["label"]]] for r in rows)
    opts = _opts(tmp_path, dataset=str(path), text_column="sentence", label_column="sentiment")

    dataset = resolve_data(opts, opts.out)

    assert dataset.folder == opts.out / "data" / "reviews" and dataset.name == "reviews"
    assert dataset.template == "{text} It was [MASK]." and dataset.verbalizer == (
        ("negative",),
        ("positive",),
    )
    meta = json.loads((dataset.folder / "meta.json").read_text())
    assert meta["splits"]["train"]["rows"] + meta["splits"]["test"]["rows"] == 100
    assert "held out" in meta["source"] and set(meta["files"]) == {"train.jsonl.gz", "test.jsonl.gz"}
    lines = shard_lines(dataset, opts)
    assert len(lines) == 3 and all("negative" in line and "eval" in line for line in lines)


def test_the_shard_lines_deal_the_test_split_to_the_evaluators_only(tmp_path: Path) -> None:
    # 12 test examples among 20 clients: every client cannot hold one, the 2 evaluators can
    opts = _opts(tmp_path, clients=20, train_limit=100, eval_limit=12, evaluators=2)
    dataset = resolve_data(opts, opts.out)

    lines = shard_lines(dataset, opts)

    assert len(lines) == 20
    assert [line.rsplit(", ", 1)[1] for line in lines] == ["6 eval", "6 eval"] + ["0 eval"] * 18
    with pytest.raises(PartitionError, match="cannot split 12 examples among 20 clients"):
        shard_lines(dataset, _opts(tmp_path, clients=20, train_limit=100, eval_limit=12))


def test_a_missing_packed_name_is_one_line_with_the_ways_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDPROMPT_DATASETS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))

    with pytest.raises(MissingDataset, match="fedprompt data fetch imdb") as caught:
        resolve_data(_opts(tmp_path, dataset="imdb"), tmp_path / "run")
    assert "\n" not in str(caught.value) and "available: sst2" in str(caught.value)


def test_sst2_by_name_is_the_built_in_copy_when_nothing_else_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEDPROMPT_DATASETS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))

    dataset = resolve_data(_opts(tmp_path), tmp_path / "run")

    assert dataset.folder == builtin_datasets_dir() / "sst2" and dataset.name == "sst2"
    assert dataset.labels == ("negative", "positive") and dataset.template == "{text} It was [MASK]."


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        resolve_data(_opts(tmp_path, dataset=str(tmp_path / "absent.csv")), tmp_path / "run")


def test_an_experiment_cell_on_a_file_passes_its_columns_to_simulate_and_the_warm_start() -> None:
    from fedprompt.sim.experiments.config import ExperimentConfig, expand
    from fedprompt.sim.experiments.runner import _key, simulate_options, unsupported, warm_start_options

    config = ExperimentConfig.model_validate(
        {
            "name": "own",
            "title": "own data",
            "base": {"dataset": "data/reviews.csv", "text_column": "sentence", "label_column": "sentiment",
                     "labels": ["negative", "positive"], "local_steps": 5},
            "grid": {"partition": ["iid", "label:0.5"]},
            "warm_start": {"steps": 10},
        }
    )  # fmt: skip
    cell = expand(config)[0]

    assert unsupported(cell.options, simulate_options()) == {}
    warm = warm_start_options(config, cell)
    assert {k: warm[k] for k in ("dataset", "text_column", "label_column", "labels")} == {
        "dataset": "data/reviews.csv", "text_column": "sentence", "label_column": "sentiment",
        "labels": ["negative", "positive"],
    }  # fmt: skip
    assert _key(warm).startswith("reviews-20tok-10steps-")


def test_a_file_with_a_bad_label_word_leaves_no_folder_behind(tmp_path: Path) -> None:
    path = tmp_path / "mail.csv"
    path.write_text("text,label\n" + "".join(f"m{i},{'spam' if i % 3 else 'ham'}\n" for i in range(30)))
    opts = _opts(tmp_path, dataset=str(path))

    with pytest.raises(LabelWordError):
        resolve_data(opts, opts.out)
    assert not opts.out.exists()
