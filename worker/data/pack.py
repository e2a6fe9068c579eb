"""Writing and describing packed data sets: meta.json with labels, splits and checksums, train/test JSONL.gz.

The files are gzip'ed without a timestamp, so the same examples give the same bytes and checksums.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fedprompt.worker.data.dataset import DataError, TextDataset

SPLITS = ("train", "test")


def _rows(data: TextDataset) -> bytes:
    lines = []
    for ex in data.examples:
        row: dict[str, Any] = (
            {"text": ex.text, "label": ex.label}
            if data.task == "single"
            else {"text_a": ex.text, "text_b": ex.text_b or "", "label": ex.label}
        )
        lines.append(json.dumps(row, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def _gzip(raw: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as fh:
        fh.write(raw)
    return buf.getvalue()


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split_facts(data: TextDataset) -> dict[str, Any]:
    """Rows and rows per label name of one split."""
    return {"rows": len(data), "per_label": dict(zip(data.label_names, data.label_counts(), strict=True))}


def write_packed(
    folder: Path,
    train: TextDataset,
    test: TextDataset,
    *,
    name: str,
    source: str,
    origin: str,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a packed data set into `folder` (made whole in a temporary sibling, then moved into place);
    returns its meta.json."""
    if train.label_names != test.label_names or train.task != test.task:
        raise DataError("train and test must have the same labels and task")
    if folder.exists() and not overwrite:
        raise DataError(f"{folder} already exists; pass --force to replace it")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        files: dict[str, Any] = {}
        for split, data in zip(SPLITS, (train, test), strict=True):
            blob = _gzip(_rows(data))
            (staging / f"{split}.jsonl.gz").write_bytes(blob)
            files[f"{split}.jsonl.gz"] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
        meta = {
            "name": name,
            "task": train.task,
            "labels": list(train.label_names),
            "source": source,
            "origin": origin,
            "splits": {split: split_facts(data) for split, data in zip(SPLITS, (train, test), strict=True)},
            "files": files,
            **(extra or {}),
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return meta


def verify(folder: Path) -> list[str]:
    """The files of a packed data set whose sha256 differs from meta.json's (none listed: nothing to check)."""
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    bad = []
    for file, facts in (meta.get("files") or {}).items():
        path = folder / file
        if not path.is_file() or sha256_file(path) != facts.get("sha256"):
            bad.append(file)
    return bad


def describe(folder: Path) -> dict[str, Any]:
    """What `fedprompt data list` shows of a packed data set: task, labels, rows per split, size, source."""
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    splits = meta.get("splits") or {}
    rows: dict[str, int | None] = {}
    for split in SPLITS:
        if isinstance(splits.get(split), dict) and isinstance(splits[split].get("rows"), int):
            rows[split] = splits[split]["rows"]
        else:
            path = next(
                (p for p in (folder / f"{split}.jsonl.gz", folder / f"{split}.jsonl") if p.is_file()), None
            )
            rows[split] = _count_lines(path) if path else None
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    return {
        "name": folder.name,
        "folder": str(folder),
        "task": meta.get("task"),
        "labels": meta.get("labels"),
        "train": rows["train"],
        "test": rows["test"],
        "bytes": size,
        "source": meta.get("source", ""),
        "origin": meta.get("origin", ""),
        "checksums": bool(meta.get("files")),
    }


def _count_lines(path: Path) -> int:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())
