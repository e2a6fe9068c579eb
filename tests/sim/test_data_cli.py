"""`fedprompt data`: list what is installed (and where it would go), import a user's file, fetch the paper's
sets from the Hugging Face hub (the mapping tested on a local copy in the hub's layout; offline: one line)."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.sim.data_cli import data_app
from fedprompt.sim.hub import HUB_SETS
from fedprompt.worker.data import builtin_datasets_dir, load_dataset
from fedprompt.worker.data.pack import verify
from typer.testing import CliRunner

from tests import fixtures

runner = CliRunner()


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user data folder and no $FEDPROMPT_DATASETS."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FEDPROMPT_DATASETS", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # not the user's cache
    return tmp_path / "xdg" / "fedprompt" / "datasets"


def _rows(name: str, split: str, n: int) -> list[dict[str, Any]]:
    return fixtures.rows(name, split, n)


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def test_list_without_data_shows_the_built_in_sst2_and_where_the_others_would_go(user_dir: Path) -> None:
    done = runner.invoke(data_app, ["list"])

    assert done.exit_code == 0, done.output
    (sst2,) = [line for line in done.output.splitlines() if line.startswith("sst2 ")]
    assert "train  67,349  test    872" in sst2 and f"(built-in: {builtin_datasets_dir()})" in sst2
    assert "$FEDPROMPT_DATASETS (unset)" in done.output and str(user_dir) in done.output
    assert "built-in: sst2, shipped with the package for the demo" in done.output
    assert (
        "fetchable from the Hugging Face hub: imdb, offenseval, twitter, enron, lingspam, qnli, rte"
        in done.output
    )
    as_json = json.loads(runner.invoke(data_app, ["list", "--json"]).output)
    assert [(d["name"], d["from"]) for d in as_json["datasets"]] == [("sst2", "built-in")]
    assert as_json["builtin_datasets"] == ["sst2"] and as_json["searched"][-1] == str(builtin_datasets_dir())


def test_list_says_which_copy_of_sst2_is_read_when_the_env_folder_has_one(
    user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDPROMPT_DATASETS", str(fixtures.DATASETS))

    done = runner.invoke(data_app, ["list"])

    assert done.exit_code == 0, done.output
    (sst2,) = [line for line in done.output.splitlines() if line.startswith("sst2 ")]
    assert f"($FEDPROMPT_DATASETS: {fixtures.DATASETS})" in sst2 and "train     400  test    100" in sst2
    assert f"sst2 is read from $FEDPROMPT_DATASETS ({fixtures.DATASETS / 'sst2'}) instead" in done.output
    assert "fetchable" not in done.output  # all eight are there


def test_import_packs_a_file_that_list_shows_and_names_load(user_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "mail.tsv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, delimiter="\t")
        writer.writerow(["body", "kind"])
        writer.writerows([f"message number {i}", "spam" if i % 7 == 0 else "ham"] for i in range(70))

    done = runner.invoke(
        data_app, ["import", str(path), "--name", "mail", "--text-column", "body", "--label-column", "kind"]
    )

    assert done.exit_code == 0, done.output
    assert f"wrote {user_dir / 'mail'}" in done.output and "labels ham, spam" in done.output
    meta = json.loads((user_dir / "mail" / "meta.json").read_text())
    assert meta["splits"]["test"]["per_label"] == {"ham": 6, "spam": 1}
    assert "held out (seed 13)" in meta["source"] and verify(user_dir / "mail") == []
    assert len(load_dataset("mail", "train")) == 63
    listed = runner.invoke(data_app, ["list"])
    assert "mail" in listed.output and "labels ham, spam" in listed.output and "63" in listed.output
    again = runner.invoke(data_app, ["import", str(path), "--name", "mail", "--text-column", "body", "--label-column", "kind"])  # fmt: skip
    assert again.exit_code == 2 and "--force" in _one_line(again.output)
    as_json = json.loads(runner.invoke(data_app, ["list", "--json"]).output)
    assert [(d["name"], d["from"]) for d in as_json["datasets"]] == [
        ("mail", "user data folder"),
        ("sst2", "built-in"),
    ]
    assert as_json["writes_to"] == str(user_dir)


def test_import_of_a_bad_file_is_one_line(user_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("sentence,label\nfine,1\n")

    done = runner.invoke(data_app, ["import", str(path)])

    assert done.exit_code == 2
    assert "missing column(s) text" in _one_line(done.output)


def test_fetch_offline_is_one_line_naming_the_datasets_variable(
    user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    done = runner.invoke(data_app, ["fetch", "sst2"])

    assert done.exit_code == 2
    line = _one_line(done.output)
    assert line.startswith("error: offline (HF_HUB_OFFLINE=1)") and "$FEDPROMPT_DATASETS" in line
    assert line.endswith(f"; sst2 is built in and needs no fetch ({builtin_datasets_dir() / 'sst2'})")
    assert not user_dir.exists()
    other = _one_line(runner.invoke(data_app, ["fetch", "imdb"]).output)
    assert other.startswith("error: offline (HF_HUB_OFFLINE=1)") and "built in" not in other


def test_fetch_of_an_unknown_name_lists_the_known_ones(user_dir: Path) -> None:
    done = runner.invoke(data_app, ["fetch", "mnli"])
    assert done.exit_code == 2 and "sst2, imdb, offenseval" in _one_line(done.output)


# ---------------------------------------------------------------- the hub mapping, on a local copy


def glue_copy(root: Path) -> Path:
    """A small copy of the hub's nyu-mll/glue in its layout: a README declaring the configurations and
    parquet files per split, with the hub's column names and label features (test labels are -1)."""
    datasets = pytest.importorskip("datasets")
    folder = root / "glue"
    features = {
        "sst2": datasets.Features(
            {
                "sentence": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["negative", "positive"]),
                "idx": datasets.Value("int32"),
            }
        ),
        "rte": datasets.Features(
            {
                "sentence1": datasets.Value("string"),
                "sentence2": datasets.Value("string"),
                "label": datasets.ClassLabel(names=["entailment", "not_entailment"]),
                "idx": datasets.Value("int32"),
            }
        ),
    }
    splits = {"train": "train", "validation": "test", "test": "test"}
    configs = []
    for config, feats in features.items():
        (folder / config).mkdir(parents=True)
        for split, source in splits.items():
            rows = _rows(config, source, 30 if split == "train" else 12)
            if config == "sst2":
                columns: dict[str, list[Any]] = {"sentence": [r["text"] for r in rows]}
            else:
                columns = {"sentence1": [r["text_a"] for r in rows], "sentence2": [r["text_b"] for r in rows]}
            columns["label"] = [r["label"] if split != "test" else -1 for r in rows]
            columns["idx"] = list(range(len(rows)))
            # the hub's unlabelled test split stores -1, which a ClassLabel feature does not take
            split_features = (
                feats if split != "test" else datasets.Features({**feats, "label": datasets.Value("int64")})
            )
            datasets.Dataset.from_dict(columns, features=split_features).to_parquet(
                str(folder / config / f"{split}-00000-of-00001.parquet")
            )
        configs.append(
            f"- config_name: {config}\n  data_files:\n"
            + "".join(f"  - split: {split}\n    path: {config}/{split}-*\n" for split in splits)
        )
    (folder / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")
    return folder


@pytest.fixture(scope="module")
def hub_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return glue_copy(tmp_path_factory.mktemp("hub"))


def test_fetch_maps_sst2_from_the_hubs_layout(
    user_dir: Path, hub_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local copy needs no network

    done = runner.invoke(data_app, ["fetch", "sst2", "--from", str(hub_copy)])

    assert done.exit_code == 0, done.output
    meta = json.loads((user_dir / "sst2" / "meta.json").read_text())
    assert (meta["task"], meta["labels"]) == ("single", ["negative", "positive"])
    assert meta["splits"]["train"]["rows"] == 30 and meta["splits"]["test"]["rows"] == 12  # validation
    assert "train = train, test = validation" in meta["origin"]
    assert set(meta["files"]) == {"train.jsonl.gz", "test.jsonl.gz"} and verify(user_dir / "sst2") == []
    test = load_dataset("sst2", "test")
    expected = _rows("sst2", "test", 12)
    assert [(e.text, e.label) for e in test] == [(r["text"], r["label"]) for r in expected]


def test_fetch_maps_a_sentence_pair_set(
    user_dir: Path, hub_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    done = runner.invoke(data_app, ["fetch", "rte", "--from", str(hub_copy)])

    assert done.exit_code == 0, done.output
    train = load_dataset("rte", "train")
    expected = _rows("rte", "train", 30)
    assert train.task == "pair" and train.label_names == ["entailment", "not_entailment"]
    assert [(e.text, e.text_b, e.label) for e in train] == [
        (r["text_a"], r["text_b"], r["label"]) for r in expected
    ]
    with gzip.open(user_dir / "rte" / "train.jsonl.gz", "rt") as fh:
        first = json.loads(fh.readline())
    assert set(first) == {"text_a", "text_b", "label"}
    again = runner.invoke(data_app, ["fetch", "rte", "--from", str(hub_copy)])
    assert again.exit_code == 2 and "--force" in _one_line(again.output)
    assert runner.invoke(data_app, ["fetch", "rte", "--from", str(hub_copy), "--force"]).exit_code == 0


def test_fetched_files_are_the_same_bytes_each_time(
    tmp_path: Path, hub_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedprompt.sim.hub import fetch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a = fetch("sst2", tmp_path / "a", source=str(hub_copy), cache_dir=tmp_path / "cache")
    b = fetch("sst2", tmp_path / "b", source=str(hub_copy), cache_dir=tmp_path / "cache")
    assert a["files"] == b["files"]


def test_every_paper_set_has_a_mapping_whose_labels_match_the_packed_ones() -> None:
    assert list(HUB_SETS) == ["sst2", "imdb", "offenseval", "twitter", "enron", "lingspam", "qnli", "rte"]
    for name, hub in HUB_SETS.items():
        meta = json.loads((fixtures.DATASETS / name / "meta.json").read_text())
        assert (list(hub.labels), hub.task) == (meta["labels"], meta["task"]), name
