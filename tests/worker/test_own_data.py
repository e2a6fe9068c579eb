"""One's own data: a file with its own columns and string labels read like a packed set, a seeded held-out
split, the packed format written with checksums, and label words taken from the label names."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from fedprompt.worker.data import (
    DataError,
    DataSource,
    LabelWordError,
    choose_prompt,
    load_dataset,
    load_source,
    load_splits,
    parse_labels,
    parse_verbalizer,
)
from fedprompt.worker.data.pack import describe, verify, write_packed
from fedprompt.worker.data.source import hold_out, table_name
from fedprompt.worker.data.verbalizer import load_tokenizer, word_pieces

from tests import fixtures

MODEL = "all-MiniLM-L6-v2"


def sst2_rows(n: int, split: str = "train") -> list[dict]:
    return fixtures.rows("sst2", split, n)


def write_csv(path: Path, rows: list[dict], names: tuple[str, str], delimiter: str = ",") -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter=delimiter)
        writer.writerow(["sentence", "sentiment"])
        for row in rows:
            writer.writerow([row["text"], names[row["label"]]])
    return path


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer(MODEL)


def test_a_file_with_its_own_columns_and_string_labels_reads_like_a_packed_set(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "reviews.csv", sst2_rows(200), ("negative", "positive"))
    src = DataSource(data=str(path), text_column="sentence", label_column="sentiment")

    splits = load_splits(src)

    assert splits.held_out and splits.name == "reviews"
    assert splits.train.label_names == splits.test.label_names == ["negative", "positive"]
    assert len(splits.train) + len(splits.test) == 200
    # a seeded, stratified 10 % of each label
    counts = splits.train.label_counts()
    held = splits.test.label_counts()
    assert all(abs(h - round((c + h) * 0.1)) <= 1 for c, h in zip(counts, held, strict=True))
    again = load_splits(src)
    assert [e.text for e in again.test] == [e.text for e in splits.test]


def test_a_train_file_and_a_test_file_share_the_label_ids(tmp_path: Path) -> None:
    train = write_csv(tmp_path / "train.tsv", sst2_rows(50), ("bad", "good"), "\t")
    test_rows = [r for r in sst2_rows(20, "test") if r["label"] == 1]  # 'good' only: ids must still match
    test = write_csv(tmp_path / "test.tsv", test_rows, ("bad", "good"), "\t")

    splits = load_splits(
        DataSource(data=str(train), test_data=str(test), text_column="sentence", label_column="sentiment")
    )

    assert not splits.held_out
    assert splits.test.label_names == ["bad", "good"] and set(splits.test.labels) == {1}


def test_labels_option_orders_the_ids_and_refuses_unknown_names(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", sst2_rows(30), ("negative", "positive"))
    src = DataSource(data=str(path), text_column="sentence", label_column="sentiment")

    flipped, _ = load_source(DataSource(**{**src.__dict__, "labels": ("positive", "negative")}))
    assert flipped.label_names == ["positive", "negative"]

    with pytest.raises(DataError, match=r"unknown label 'negative'; known labels: pos, neg"):
        load_source(DataSource(**{**src.__dict__, "labels": ("pos", "neg")}))


def test_wrong_columns_name_the_flags(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", sst2_rows(5), ("negative", "positive"))

    with pytest.raises(
        DataError, match=r"missing column\(s\) text, label; the row has sentence, sentiment .*--text-column"
    ):
        load_source(DataSource(data=str(path)))


def test_parse_labels_takes_commas_or_json() -> None:
    assert parse_labels("negative, positive") == ("negative", "positive")
    assert parse_labels('["ham", "spam"]') == ("ham", "spam")
    assert parse_labels(None) is None
    with pytest.raises(DataError, match="at least two distinct"):
        parse_labels("a,a")


def test_table_names_drop_the_suffix() -> None:
    assert table_name("/x/reviews.csv.gz") == "reviews"
    assert table_name("spam.tsv") == "spam"
    assert table_name("rows.jsonl") == "rows"


def test_hold_out_keeps_every_label_in_train(tmp_path: Path) -> None:
    path = tmp_path / "skewed.csv"
    path.write_text("text,label\n" + "".join(f"m{i},{'spam' if i < 3 else 'ham'}\n" for i in range(40)))
    data, _ = load_source(DataSource(data=str(path)))

    train, test = hold_out(data)

    assert train.label_counts()[1] >= 1 and test.label_counts()[1] >= 1
    assert len(train) + len(test) == 40


def test_packed_files_are_deterministic_with_checksums(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "r.csv", sst2_rows(60), ("negative", "positive"))
    splits = load_splits(DataSource(data=str(path), text_column="sentence", label_column="sentiment"))

    meta = write_packed(
        tmp_path / "a" / "mine", splits.train, splits.test, name="mine", source="s", origin="o"
    )
    again = write_packed(
        tmp_path / "b" / "mine", splits.train, splits.test, name="mine", source="s", origin="o"
    )

    assert meta["files"] == again["files"]
    assert meta["splits"]["train"]["rows"] + meta["splits"]["test"]["rows"] == 60
    assert verify(tmp_path / "a" / "mine") == []
    back = load_dataset(tmp_path / "a" / "mine", "test")
    assert [e.text for e in back] == [e.text for e in splits.test]
    facts = describe(tmp_path / "a" / "mine")
    assert (facts["train"], facts["test"], facts["labels"]) == (
        len(splits.train),
        len(splits.test),
        ["negative", "positive"],
    )
    with pytest.raises(DataError, match="already exists"):
        write_packed(tmp_path / "a" / "mine", splits.train, splits.test, name="mine", source="s", origin="o")
    (tmp_path / "a" / "mine" / "test.jsonl.gz").write_bytes(b"changed")
    assert verify(tmp_path / "a" / "mine") == ["test.jsonl.gz"]


# ---------------------------------------------------------------- templates and label words


def test_own_data_gets_the_generic_template_and_its_label_names(tokenizer) -> None:  # type: ignore[no-untyped-def]
    template, words = choose_prompt(
        name="reviews",
        task="single",
        label_names=["negative", "positive"],
        template=None,
        verbalizer=None,
        tokenizer=tokenizer,
        model=MODEL,
    )
    assert template == "{text} It was [MASK]."
    assert words == [["negative"], ["positive"]]

    pair_template, pair_words = choose_prompt(
        name="mine", task="pair", label_names=["yes", "no"], template=None, verbalizer=None,
        tokenizer=tokenizer, model=MODEL,
    )  # fmt: skip
    assert "{text_a}" in pair_template and pair_words == [["yes"], ["no"]]


def test_a_multi_piece_label_name_is_an_error_naming_it_its_pieces_and_single_piece_words(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert word_pieces("spam", tokenizer) == ["spa", "##m"]

    with pytest.raises(LabelWordError) as caught:
        choose_prompt(
            name="mail", task="single", label_names=["ham", "spam"], template=None, verbalizer=None,
            tokenizer=tokenizer, model=MODEL,
        )  # fmt: skip

    message = str(caught.value)
    assert "label 'spam' is 2 word pieces of all-MiniLM-L6-v2's vocabulary (spa ##m)" in message
    assert "--verbalizer 'normal;junk'" in message


def test_a_given_multi_piece_label_word_is_refused(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(
        LabelWordError, match=r"label word 'spam' of label 'spam' is 2 word pieces .*\(spa ##m\)"
    ):
        choose_prompt(
            name="mail", task="single", label_names=["ham", "spam"], template=None, verbalizer="ham;spam",
            tokenizer=tokenizer, model=MODEL,
        )  # fmt: skip


def test_verbalizer_syntax_is_the_same_everywhere(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert parse_verbalizer("terrible;great") == [["terrible"], ["great"]]
    assert parse_verbalizer("bad, awful; good") == [["bad", "awful"], ["good"]]
    assert parse_verbalizer('[["bad","awful"],["good"]]') == [["bad", "awful"], ["good"]]
    with pytest.raises(DataError, match="at least two labels"):
        parse_verbalizer("great")
    with pytest.raises(LabelWordError, match="words for 3 labels; the data has 2"):
        choose_prompt(
            name="x", task="single", label_names=["a", "b"], template=None, verbalizer="a;b;c",
            tokenizer=tokenizer, model=MODEL,
        )  # fmt: skip


def test_unnamed_labels_ask_for_names_or_words(tokenizer) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LabelWordError, match=r"the labels have no names \(ids 0, 1\).*--labels"):
        choose_prompt(
            name="x", task="single", label_names=["0", "1"], template=None, verbalizer=None,
            tokenizer=tokenizer, model=MODEL,
        )  # fmt: skip


def test_packed_sets_keep_their_presets_and_a_namesake_folder_does_not(tokenizer) -> None:  # type: ignore[no-untyped-def]
    _, words = choose_prompt(
        name="enron", task="single", label_names=["ham", "spam"], template=None, verbalizer=None,
        tokenizer=tokenizer, model=MODEL,
    )  # fmt: skip
    assert words == [["normal"], ["junk"]]
    _, own = choose_prompt(
        name="sst2", task="single", label_names=["bad", "good"], template=None, verbalizer=None,
        tokenizer=tokenizer, model=MODEL,
    )  # fmt: skip
    assert own == [["bad"], ["good"]]


def test_shard_summary_gives_sizes_and_label_mix(tmp_path: Path) -> None:
    from fedprompt.worker.shards import ShardSpec, shard_sizes, shard_summary

    path = write_csv(tmp_path / "r.csv", sst2_rows(120), ("negative", "positive"))
    spec = ShardSpec(
        data=str(path),
        text_column="sentence",
        label_column="sentiment",
        partition="label:0.3",
        num_partitions=3,
    )

    summary = shard_summary(spec)

    assert [(s["train"], s["eval"]) for s in summary] == shard_sizes(spec)
    assert all(sum(s["per_label"].values()) == s["train"] for s in summary)
    assert set(summary[0]["per_label"]) == {"negative", "positive"}
