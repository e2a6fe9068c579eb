"""One data path for every command: a packed data set (name or folder) or a user's CSV / TSV / JSONL file,
optionally with a test file, read with the same column and label options everywhere."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fedprompt.worker.data.dataset import DataError, TextDataset, load_dataset, load_table

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".json", ".ndjson", ".csv.gz", ".tsv.gz", ".jsonl.gz")
# The held-out split of a file that comes without a test file: its share and its seed (fixed, so runs
# with different --seed values evaluate on the same examples).
HELD_OUT_FRACTION = 0.1
HELD_OUT_SEED = 13


def is_table(data: str | os.PathLike[str]) -> bool:
    """True when `data` names a user's file (an existing file, or a name ending in a table suffix)."""
    return Path(data).is_file() or str(data).lower().endswith(TABLE_SUFFIXES)


def table_name(path: str | os.PathLike[str]) -> str:
    """A data set name for a file: its name without the table suffix ('reviews.csv.gz' -> 'reviews')."""
    name = Path(path).name
    for suffix in sorted(TABLE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] or name
    return Path(path).stem


def parse_labels(text: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...] | None:
    """'negative,positive' (or a JSON list, or a list) -> ('negative', 'positive'): label names in id
    order (None when not given)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, str) and text.strip().startswith("["):
        try:
            text = json.loads(text)
        except json.JSONDecodeError:
            raise DataError(f"--labels {text!r} is not a JSON list; e.g. negative,positive") from None
    raw = text.split(",") if isinstance(text, str) else list(text)
    names = tuple(str(x).strip() for x in raw)
    if len(names) < 2 or not all(names) or len(set(names)) != len(names):
        raise DataError(
            f"--labels {text!r}: give at least two distinct comma-separated label names, in id order"
        )
    return names


@dataclass(frozen=True)
class DataSource:
    """Where a command's examples come from and how a file's columns and labels are read."""

    data: str
    test_data: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    text_b_column: str | None = None
    labels: tuple[str, ...] | None = None
    datasets_dir: str | None = None

    @property
    def is_table(self) -> bool:
        """True when the train data is a user's file rather than a packed data set."""
        return is_table(self.data)

    def _table(self, path: str, label_names: list[str] | None) -> TextDataset:
        return load_table(path, self.text_column, self.label_column, self.text_b_column, label_names)


def load_source(src: DataSource) -> tuple[TextDataset, TextDataset | None]:
    """(the train split, the test split or None when there is none) of a data source."""
    names = list(src.labels) if src.labels else None
    if src.is_table:
        train = src._table(src.data, names)
        train.name = table_name(src.data)
    else:
        train = load_dataset(src.data, "train", src.datasets_dir)
        if names is not None and names != train.label_names:
            raise DataError(
                f"--labels {','.join(names)}: {train.name} names its labels in meta.json "
                f"({','.join(train.label_names)}); --labels is for CSV/TSV/JSONL files"
            )
    if src.test_data is not None:
        test = src._table(src.test_data, names or train.label_names)
        if test.task != train.task:
            raise DataError(f"{src.test_data} is a {test.task} data set but {src.data} is a {train.task} one")
        test.name = train.name
        return train, test
    if src.is_table:
        return train, None
    try:
        return train, load_dataset(src.data, "test", src.datasets_dir)
    except DataError:
        return train, None


def hold_out(
    data: TextDataset, fraction: float = HELD_OUT_FRACTION, seed: int = HELD_OUT_SEED
) -> tuple[TextDataset, TextDataset]:
    """(train, test): a seeded `fraction` of every label held out (at least one example of a label
    with two or more), the rest kept in their order."""
    if not 0 < fraction < 1:
        raise DataError(f"the held-out fraction must be in (0, 1); got {fraction}")
    rng = np.random.default_rng([seed, 0x4E1D])
    labels = np.asarray(data.labels)
    held: list[int] = []
    for label in range(data.num_labels):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            continue
        cut = min(len(members) - 1, max(1, round(len(members) * fraction)))
        held += [int(i) for i in rng.permutation(members)[:cut]]
    if not held:
        raise DataError(f"{data.name or 'the data'}: too few examples to hold out a test split")
    kept = sorted(set(range(len(data))) - set(held))
    return data.subset(kept), data.subset(sorted(held))


@dataclass
class Splits:
    """A data source's train and test splits; `held_out` says the test split was cut from the train file."""

    train: TextDataset
    test: TextDataset
    held_out: bool

    @property
    def name(self) -> str:
        """The data set's name (a packed set's folder, a file's name without its suffix)."""
        return self.train.name


def load_splits(src: DataSource, *, fraction: float = HELD_OUT_FRACTION, seed: int = HELD_OUT_SEED) -> Splits:
    """Train and test splits; without a test split, a seeded stratified share of train is held out."""
    train, test = load_source(src)
    if test is not None:
        return Splits(train, test, held_out=False)
    kept, held = hold_out(train, fraction, seed)
    return Splits(kept, held, held_out=True)
