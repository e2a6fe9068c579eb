"""Data loading: packed data sets by name or path, users' tables, and errors that name file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fedprompt.worker.data import (
    DATASETS_ENV,
    PRESETS,
    DataError,
    Example,
    MissingDataset,
    builtin_datasets_dir,
    dataset_dirs,
    dataset_origin,
    datasets_dir,
    load_dataset,
    load_table,
    preset_for,
    resolve_dataset,
    user_datasets_dir,
)
from fedprompt.worker.data.pack import sha256_file

from tests import fixtures


def write_packed(
    root: Path, name: str, task: str = "single", rows: list[dict[str, Any]] | None = None
) -> Path:
    """A packed data set folder: meta.json plus train/test JSONL.gz."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"task": task, "labels": ["neg", "pos"]}))
    rows = rows or [{"text": "bad", "label": 0}, {"text": "good", "label": 1}, {"text": "fine", "label": 1}]
    for split in ("train", "test"):
        with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return folder


def test_load_dataset_by_name_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_packed(tmp_path, "toy")
    monkeypatch.setenv(DATASETS_ENV, str(tmp_path))

    data = load_dataset("toy", "test")

    assert data.examples == [Example("bad", 0), Example("good", 1), Example("fine", 1)]
    assert (data.label_names, data.task, data.name) == (["neg", "pos"], "single", "toy")
    assert data.labels == [0, 1, 1]
    assert data.label_counts() == [1, 2]


def test_load_dataset_by_path_and_explicit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATASETS_ENV, raising=False)
    folder = write_packed(tmp_path, "toy")

    assert len(load_dataset(folder)) == 3
    assert len(load_dataset("toy", datasets_dir=tmp_path)) == 3


def test_load_pair_dataset(tmp_path: Path) -> None:
    rows = [{"text_a": "q?", "text_b": "a.", "label": 0}, {"text_a": "x", "text_b": "y", "label": 1}]
    write_packed(tmp_path, "pairs", task="pair", rows=rows)

    data = load_dataset("pairs", datasets_dir=tmp_path)

    assert data.task == "pair"
    assert data.examples[0] == Example("q?", 0, text_b="a.")


def test_bare_names_are_looked_up_in_the_env_folder_then_the_user_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(DATASETS_ENV, raising=False)
    assert user_datasets_dir() == tmp_path / "xdg" / "fedprompt" / "datasets"
    assert datasets_dir() == user_datasets_dir()
    write_packed(user_datasets_dir(), "mine")
    assert load_dataset("mine").name == "mine"

    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "shared"))
    write_packed(tmp_path / "shared", "toy")
    assert datasets_dir() == tmp_path / "shared"
    assert load_dataset("toy").name == "toy" and load_dataset("mine").name == "mine"


def test_a_missing_name_says_where_it_looked_and_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(DATASETS_ENV, raising=False)

    with pytest.raises(MissingDataset) as caught:
        load_dataset("imdb")

    message = str(caught.value)
    assert "\n" not in message
    assert f"${DATASETS_ENV} (unset)" in message and str(tmp_path / "xdg") in message
    assert f"built-in {builtin_datasets_dir()}" in message and "available: sst2)" in message
    assert "fedprompt data fetch imdb" in message and "CSV/TSV/JSONL" in message


def test_sst2_resolves_to_the_env_folder_then_the_user_folder_then_the_built_in_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(DATASETS_ENV, raising=False)
    builtin = builtin_datasets_dir() / "sst2"
    assert dataset_dirs() == [user_datasets_dir(), builtin_datasets_dir()]
    assert resolve_dataset("sst2") == builtin and dataset_origin(builtin) == "built-in"

    mine = write_packed(user_datasets_dir(), "sst2")
    assert resolve_dataset("sst2") == mine and dataset_origin(mine) == "user data folder"
    assert len(load_dataset("sst2")) == 3

    monkeypatch.setenv(DATASETS_ENV, str(tmp_path / "env"))
    theirs = write_packed(tmp_path / "env", "sst2")
    assert resolve_dataset("sst2") == theirs and dataset_origin(theirs) == f"${DATASETS_ENV}"
    # an explicit folder is the only one looked in
    with pytest.raises(MissingDataset):
        load_dataset("sst2", datasets_dir=tmp_path / "empty")


def test_the_product_looks_for_no_data_sets_beside_the_repository() -> None:
    root = Path(__file__).resolve().parents[2]
    for package in ("coordinator", "worker", "shared", "sim"):
        for path in (root / package).rglob("*.py"):
            text = path.read_text()
            assert "shared/datasets" not in text and '"shared" / "datasets"' not in text, path


def test_the_built_in_sst2_is_the_whole_set_with_its_source_and_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(DATASETS_ENV, raising=False)

    test, train = load_dataset("sst2", "test"), load_dataset("sst2", "train")

    assert (len(test), test.label_counts()) == (872, [428, 444])
    assert (len(train), train.label_counts()) == (67349, [29780, 37569])
    assert train.label_names == ["negative", "positive"] and train.task == "single"
    folder = builtin_datasets_dir() / "sst2"
    assert resolve_dataset("sst2") == folder
    assert train.meta["splits"]["train"]["rows"] == 67349 and "Socher et al. 2013" in train.meta["source"]
    terms = (folder / "SOURCE.md").read_text()
    assert (
        "Socher et al. 2013" in terms
        and "## Terms" in terms
        and train.meta["origin"].split()[1].split("@")[0] in terms
    )
    for name in ("train.jsonl.gz", "test.jsonl.gz", "meta.json"):  # the checksums SOURCE.md states
        assert sha256_file(folder / name) in terms, name


@pytest.mark.needs_datasets
def test_the_built_in_sst2_is_byte_for_byte_the_full_packed_set(full_datasets: Path) -> None:
    for name in ("train.jsonl.gz", "test.jsonl.gz", "meta.json"):
        shipped, full = builtin_datasets_dir() / "sst2" / name, full_datasets / "sst2" / name
        assert shipped.read_bytes() == full.read_bytes(), name


def test_unknown_dataset_name_lists_the_available_ones(tmp_path: Path) -> None:
    write_packed(tmp_path, "toy")

    with pytest.raises(DataError, match=r"no data set named 'nope' \(looked in .*available: toy"):
        load_dataset("nope", datasets_dir=tmp_path)


def test_dataset_label_out_of_range_names_file_and_line(tmp_path: Path) -> None:
    write_packed(tmp_path, "toy", rows=[{"text": "a", "label": 0}, {"text": "b", "label": 5}])

    with pytest.raises(DataError, match=r"train\.jsonl\.gz:2: label id 5 is out of range"):
        load_dataset("toy", datasets_dir=tmp_path)


def test_sample_is_seeded_and_limited(tmp_path: Path) -> None:
    rows = [{"text": str(i), "label": i % 2} for i in range(50)]
    write_packed(tmp_path, "toy", rows=rows)
    data = load_dataset("toy", datasets_dir=tmp_path)

    a, b, c = data.sample(10, seed=1), data.sample(10, seed=1), data.sample(10, seed=2)

    assert len(a) == 10 and a.examples == b.examples and a.examples != c.examples
    assert data.sample(None) is data


# ---------------------------------------------------------------- users' tables


def test_csv_with_label_names_and_quoted_multiline_text(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text('review,sentiment\n"great, really",pos\n"two\nlines",neg\n')

    data = load_table(path, "review", "sentiment", label_names=["neg", "pos"])

    assert data.examples == [Example("great, really", 1), Example("two\nlines", 0)]
    assert data.label_names == ["neg", "pos"]


def test_csv_label_names_are_inferred_sorted(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("text,label\na,spam\nb,ham\nc,spam\n")

    data = load_table(path, "text", "label")

    assert data.label_names == ["ham", "spam"]
    assert data.labels == [1, 0, 1]


def test_tsv_with_int_labels_and_pairs(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("q\ts\ty\nwho?\tme.\t1\nwhy?\tno.\t0\n")

    data = load_table(path, "q", "y", text_b_column="s")

    assert data.task == "pair"
    assert data.examples == [Example("who?", 1, "me."), Example("why?", 0, "no.")]
    assert data.label_names == ["0", "1"]


def test_jsonl_gz_table(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write('{"t": "x", "l": 1}\n\n{"t": "y", "l": "neg"}\n')

    data = load_table(path, "t", "l", label_names=["neg", "pos"])

    assert data.examples == [Example("x", 1), Example("y", 0)]


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "message"),
    [
        (
            "bad.jsonl",
            '{"t": "a", "l": 0}\n{"t": "b", "l": 1}\n{"t": "c", "l": \n',
            {},
            r"bad\.jsonl:3: not valid JSON",
        ),
        ("list.jsonl", '{"t": "a", "l": 0}\n[1, 2]\n', {}, r"list\.jsonl:2: expected a JSON object"),
        ("miss.jsonl", '{"t": "a", "l": 0}\n{"t": "b"}\n', {}, r"miss\.jsonl:2: missing column\(s\) l"),
        (
            "unk.csv",
            "t,l\na,pos\nb,maybe\n",
            {"label_names": ["neg", "pos"]},
            r"unk\.csv:3: unknown label 'maybe'",
        ),
        ("range.csv", "t,l\na,0\nb,1\nc,2\n", {"label_names": ["neg", "pos"]}, r"range\.csv:4: label id 2"),
        ("fields.csv", "t,l\na,0\nb,1,extra\n", {}, r"fields\.csv:3: expected 2 fields"),
        ("nocol.csv", "text,label\na,0\n", {}, r"nocol\.csv:2: missing column\(s\) t, l"),
        ("multi.csv", 't,l\n"one\ntwo",0\nb\n', {}, r"multi\.csv:4: expected 2 fields"),
        ("null.jsonl", '{"t": null, "l": 0}\n', {}, r"null\.jsonl:1: column 't' must be a string"),
        ("mixed.csv", "t,l\na,0\nb,pos\n", {}, r"mixed\.csv: labels mix ids"),
        ("empty.csv", "", {}, r"empty\.csv: the file is empty"),
        ("data.parquet", "x", {}, r"data\.parquet: unsupported file type"),
    ],
)
def test_table_errors_name_file_and_line(
    tmp_path: Path, name: str, content: str, kwargs: dict[str, Any], message: str
) -> None:
    path = tmp_path / name
    path.write_text(content)

    with pytest.raises(DataError, match=message):
        load_table(path, "t", "l", **kwargs)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_table(tmp_path / "absent.csv", "t", "l")


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


# ---------------------------------------------------------------- presets


def test_every_packed_dataset_has_a_fitting_preset() -> None:
    from fedprompt.worker.engine import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
    folders = sorted(p for p in fixtures.DATASETS.iterdir() if (p / "meta.json").is_file())
    assert [f.name for f in folders] == sorted(PRESETS) == sorted(fixtures.NAMES)
    for folder in [*folders, builtin_datasets_dir() / "sst2"]:
        meta = json.loads((folder / "meta.json").read_text())
        preset = preset_for(folder.name, meta["task"], meta["labels"])
        assert folder.name in PRESETS and preset is not None
        assert len(preset.verbalizer) == len(meta["labels"]), folder.name
        assert ("{text_a}" in preset.template) == (meta["task"] == "pair"), folder.name
        for words in preset.verbalizer:
            for word in words:
                # A label word read by its first sub-token only should be a whole WordPiece token.
                assert len(tokenizer.tokenize(word)) == 1, (folder.name, word)


def test_only_packed_sets_with_their_own_labels_have_a_preset() -> None:
    assert preset_for("my-own", "single") is None
    assert preset_for("my-own", "pair") is None
    assert preset_for("sst2", "single", ["negative", "positive"]) is PRESETS["sst2"]
    # a folder of one's own named like a packed set does not get its label words
    assert preset_for("sst2", "single", ["ham", "spam"]) is None
    assert preset_for("rte", "single") is None


@pytest.mark.parametrize("partition", ["iid", "quantity:0.5"])
@pytest.mark.parametrize("with_test", [True, False])
def test_shard_sizes_are_the_sizes_load_shard_cuts(tmp_path: Path, partition: str, with_test: bool) -> None:
    from dataclasses import replace

    from fedprompt.worker.shards import ShardSpec, load_shard, shard_sizes

    rows = [{"text": f"sentence {i}", "label": i % 2} for i in range(60)]
    folder = write_packed(tmp_path, "toy", rows=rows)
    if not with_test:  # evaluation then comes out of each worker's train share
        (folder / "test.jsonl.gz").unlink()
    spec = ShardSpec(
        data=str(folder), partition=partition, num_partitions=4, seed=3, train_limit=50, eval_limit=20
    )
    cut = [load_shard(replace(spec, partition_id=i)) for i in range(4)]
    assert shard_sizes(spec) == [(len(train), len(evaluation)) for train, evaluation, _ in cut]
    assert sum(n for n, _ in shard_sizes(spec)) == (50 if with_test else 50 - sum(len(e) for _, e, _ in cut))
