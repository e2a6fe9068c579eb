"""The name of a user's data file: what results, logs and the packed copy call it."""

from __future__ import annotations

from pathlib import Path

from fedprompt.worker.data.source import table_name

# File names that say which split a file is, not what it holds: such a file is named after its folder.
SPLIT_NAMES = frozenset(
    {"train", "training", "test", "testing", "dev", "valid", "validation", "val", "data", "all"}
)


def own_data_name(path: str, explicit: str | None = None) -> str:
    """`explicit` when given; else the file's name without its suffix, unless that names a split
    ('train.csv', 'data.jsonl'): then its folder's ('reviews/train.csv' -> 'reviews')."""
    if explicit and explicit.strip():
        return explicit.strip()
    stem = table_name(path)
    folder = Path(path).resolve().parent.name
    return folder if stem.lower() in SPLIT_NAMES and folder else stem


DATA_NAME_HELP = (
    "Name of your data file's data set in results and logs (default: the file's name, or its folder's "
    "when the file is train.csv, data.jsonl, …)."
)
