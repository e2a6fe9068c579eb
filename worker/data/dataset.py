"""Labelled text: packed data sets (by name or folder) and a user's own CSV / TSV / JSONL files.

A packed data set is a folder with meta.json ("task": single | pair, "labels": names in id order) and
train.jsonl.gz / test.jsonl.gz, one {"text", "label"} (or {"text_a", "text_b", "label"}) object a line.
Bare names are looked up in $FEDPROMPT_DATASETS, then in the user's data folder (`user_datasets_dir`), then
in the data sets that ship inside the package (`builtin_datasets_dir`: SST-2, the demo's data).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

Task = Literal["single", "pair"]
DATASETS_ENV = "FEDPROMPT_DATASETS"
# Packed data sets installed with the package (package data; their source and terms in SOURCE.md beside them).
BUILTIN_DATASETS_DIR = Path(__file__).resolve().parent / "builtin"


class DataError(ValueError):
    """A data file that cannot be read; the message names the file and, where it applies, the line."""


@dataclass(frozen=True, slots=True)
class Example:
    """One labelled example: a text (or a pair text / text_b) and a label id."""

    text: str
    label: int
    text_b: str | None = None


@dataclass
class TextDataset:
    """Examples with their label names and task kind."""

    examples: list[Example]
    label_names: list[str]
    task: Task = "single"
    name: str = ""
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, index: int) -> Example:
        return self.examples[index]

    @property
    def labels(self) -> list[int]:
        """Label id of every example, in order."""
        return [ex.label for ex in self.examples]

    @property
    def num_labels(self) -> int:
        """Number of label names."""
        return len(self.label_names)

    def subset(self, indices: Sequence[int]) -> TextDataset:
        """A data set of the given examples (e.g. one client's partition)."""
        return TextDataset(
            [self.examples[i] for i in indices],
            self.label_names,
            self.task,
            self.name,
            self.source,
            self.meta,
        )

    def sample(self, limit: int | None, seed: int = 0) -> TextDataset:
        """A seeded random subset of at most `limit` examples (all of them, in order, when limit is None)."""
        if limit is None or limit >= len(self.examples):
            return self
        if limit < 0:
            raise ValueError(f"limit must be >= 0; got {limit}")
        picked = np.sort(np.random.default_rng([seed, 0x5A]).permutation(len(self.examples))[:limit])
        return self.subset([int(i) for i in picked])

    def label_counts(self) -> list[int]:
        """Number of examples per label id."""
        counts = [0] * len(self.label_names)
        for ex in self.examples:
            counts[ex.label] += 1
        return counts


def user_datasets_dir() -> Path:
    """Where `fedprompt data fetch` and `fedprompt data import` write: $XDG_DATA_HOME/fedprompt/datasets,
    else ~/.local/share/fedprompt/datasets."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "fedprompt" / "datasets"


def builtin_datasets_dir() -> Path:
    """The folder of the packed data sets that ship inside the package (SST-2, the demo's data)."""
    return BUILTIN_DATASETS_DIR


def dataset_dirs(override: str | os.PathLike[str] | None = None) -> list[Path]:
    """The folders bare data set names are looked up in, in order: the argument alone when given, else
    $FEDPROMPT_DATASETS (when set), the user's data folder and the package's built-in data sets."""
    if override is not None:
        return [Path(override)]
    env = os.environ.get(DATASETS_ENV)
    return [*([Path(env)] if env else []), user_datasets_dir(), builtin_datasets_dir()]


def dataset_origin(folder: str | os.PathLike[str]) -> str:
    """Where a packed data set folder was found: 'built-in', '$FEDPROMPT_DATASETS', 'user data folder'
    or 'folder' (any other path)."""
    parent = Path(folder).resolve().parent
    env = os.environ.get(DATASETS_ENV)
    if parent == builtin_datasets_dir():
        return "built-in"
    if env and parent == Path(env).resolve():
        return f"${DATASETS_ENV}"
    if parent == user_datasets_dir().resolve():
        return "user data folder"
    return "folder"


def datasets_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The first folder bare data set names are looked up in (see `dataset_dirs`)."""
    return dataset_dirs(override)[0]


def packed_folders(dirs: Sequence[Path]) -> dict[str, Path]:
    """Every packed data set (a folder with meta.json) in `dirs` by name; the first folder wins."""
    found: dict[str, Path] = {}
    for root in dirs:
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir()):
            if folder.name not in found and (folder / "meta.json").is_file():
                found[folder.name] = folder
    return found


class MissingDataset(DataError):
    """A bare data set name found in none of the data set folders; the message says how to get it."""


def _where(dirs: Sequence[Path], override: bool) -> str:
    shown = [
        ("built-in " if d == builtin_datasets_dir() else "") + str(d) + ("" if d.is_dir() else " (absent)")
        for d in dirs
    ]
    if not override and not os.environ.get(DATASETS_ENV):
        shown.insert(0, f"${DATASETS_ENV} (unset)")
    return ", ".join(shown)


def missing_dataset_message(name: str, dirs: Sequence[Path], override: bool = False) -> str:
    """One line: the name was not found where, what is there, and the ways to get data."""
    available = sorted(packed_folders(dirs))
    there = f"available: {', '.join(available)}" if available else "no data sets are installed"
    return (
        f"no data set named {name!r} (looked in {_where(dirs, override)}; {there}); "
        f"get it with `fedprompt data fetch {name}` when online, point ${DATASETS_ENV} at a folder of "
        "packed data sets, or pass a CSV/TSV/JSONL file"
    )


def resolve_dataset(
    name_or_path: str | os.PathLike[str], datasets_dir_: str | os.PathLike[str] | None = None
) -> Path:
    """The folder of a data set given by bare name or by path."""
    given = Path(name_or_path)
    if given.is_dir():
        return given
    looks_like_path = (
        os.sep in str(name_or_path) or "/" in str(name_or_path) or str(name_or_path).startswith(".")
    )
    if looks_like_path:
        raise DataError(f"data set folder {given} does not exist")
    dirs = dataset_dirs(datasets_dir_)
    folder = packed_folders(dirs).get(str(name_or_path))
    if folder is None:
        raise MissingDataset(missing_dataset_message(str(name_or_path), dirs, datasets_dir_ is not None))
    return folder


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return path.open("r", encoding="utf-8", newline="")


def load_dataset(
    name_or_path: str | os.PathLike[str],
    split: Literal["train", "test"] | str = "train",
    datasets_dir: str | os.PathLike[str] | None = None,
) -> TextDataset:
    """Load one split of a packed data set (folder with meta.json and <split>.jsonl.gz) by name or path."""
    folder = resolve_dataset(name_or_path, datasets_dir)
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(
            f"{meta_path}: missing; a data set folder needs meta.json with 'task' and 'labels'"
        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{meta_path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    task = meta.get("task")
    labels = meta.get("labels")
    if task not in ("single", "pair"):
        raise DataError(f"{meta_path}: 'task' must be 'single' or 'pair'; got {task!r}")
    if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) for x in labels):
        raise DataError(f"{meta_path}: 'labels' must be a list of at least two label names; got {labels!r}")
    for candidate in (folder / f"{split}.jsonl.gz", folder / f"{split}.jsonl"):
        if candidate.is_file():
            data = load_table(
                candidate,
                text_column="text" if task == "single" else "text_a",
                label_column="label",
                text_b_column=None if task == "single" else "text_b",
                label_names=labels,
            )
            data.name = folder.name
            data.meta = meta
            return data
    raise DataError(f"{folder}: no {split}.jsonl.gz or {split}.jsonl")


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a CSV / TSV / JSONL file, raising DataError on malformed rows."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith((".jsonl", ".json", ".ndjson")):
        with _open_text(path) as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                yield lineno, row
        return
    if name.endswith((".csv", ".tsv")):
        delimiter = "\t" if name.endswith(".tsv") else ","
        # E-mails and reviews can exceed csv's default 128 KiB field limit.
        csv.field_size_limit(1 << 30)
        with _open_text(path) as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            try:
                header = next(reader)
            except StopIteration:
                raise DataError(f"{path}: the file is empty (a header row is needed)") from None
            except csv.Error as exc:
                raise DataError(f"{path}:1: malformed header ({exc})") from None
            header = [h.strip() for h in header]
            while True:
                start = reader.line_num + 1
                try:
                    fields = next(reader)
                except StopIteration:
                    return
                except csv.Error as exc:
                    raise DataError(f"{path}:{start}: malformed row ({exc})") from None
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}:{start}: expected {len(header)} fields ({', '.join(header)}), found {len(fields)}"
                    )
                yield start, dict(zip(header, fields, strict=True))
        return
    raise DataError(f"{path}: unsupported file type; use .csv, .tsv, .jsonl or .jsonl.gz")


def _parse_label(value: Any, names: list[str] | None, where: str) -> int | str:
    """An int label id or a label name (resolved later when names are not known yet)."""
    if isinstance(value, bool) or value is None:
        raise DataError(f"{where}: label must be an integer id or a label name; got {value!r}")
    if names is not None and isinstance(value, str) and value.strip() in names:
        return names.index(value.strip())
    if isinstance(value, int):
        label = value
    elif isinstance(value, float) and value.is_integer():
        label = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        label = int(value.strip())
    elif isinstance(value, str) and names is None and value.strip():
        return value.strip()
    else:
        known = f"; known labels: {', '.join(names)}" if names is not None else ""
        raise DataError(f"{where}: unknown label {value!r}{known}")
    if names is not None and not 0 <= label < len(names):
        raise DataError(
            f"{where}: label id {label} is out of range for {len(names)} labels ({', '.join(names)})"
        )
    if label < 0:
        raise DataError(f"{where}: label id {label} is negative")
    return label


def load_table(
    path: str | os.PathLike[str],
    text_column: str,
    label_column: str,
    text_b_column: str | None = None,
    label_names: Sequence[str] | None = None,
) -> TextDataset:
    """Load a user's CSV, TSV or JSONL(.gz) file; labels may be ids or names; bad rows raise DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    names = list(label_names) if label_names is not None else None
    raw: list[tuple[str, int | str, str | None]] = []
    columns = [text_column, label_column] + ([text_b_column] if text_b_column else [])
    for lineno, row in _rows(path):
        where = f"{path}:{lineno}"
        absent = [c for c in columns if c not in row]
        if absent:
            raise DataError(
                f"{where}: missing column(s) {', '.join(absent)}; the row has {', '.join(row)} "
                "(name the columns with --text-column, --label-column and, for pairs, --text-b-column)"
            )
        text = row[text_column]
        if not isinstance(text, str):
            raise DataError(f"{where}: column {text_column!r} must be a string; got {text!r}")
        text_b = None
        if text_b_column:
            text_b = row[text_b_column]
            if not isinstance(text_b, str):
                raise DataError(f"{where}: column {text_b_column!r} must be a string; got {text_b!r}")
        raw.append((text, _parse_label(row[label_column], names, where), text_b))
    if not raw:
        raise DataError(f"{path}: no rows")
    if names is None:
        ids = {label for _, label, _ in raw if isinstance(label, int)}
        strings = {label for _, label, _ in raw if isinstance(label, str)}
        if ids and strings:
            raise DataError(
                f"{path}: labels mix ids ({sorted(ids)[:3]}) and names ({sorted(strings)[:3]}); pass label_names"
            )
        # Names sort alphabetically so the id of a label does not depend on the order of the rows.
        names = sorted(strings) if strings else [str(i) for i in range(max(ids) + 1)]
    examples = [
        Example(text, label if isinstance(label, int) else names.index(label), text_b)
        for text, label, text_b in raw
    ]
    return TextDataset(examples, names, "pair" if text_b_column else "single", path.stem, str(path))
