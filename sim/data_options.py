"""The data of a simulation: a packed data set (name or folder) or a user's file, its template and label
words, checked before any process starts, and the clients' shards shown at the start.

A packed data set is used where it is. A user's CSV / TSV / JSONL file (or a train and a test file, or a
packed set with a test file) is packed once into <out>/data/<name> (with a seeded held-out split when
no test file is given), so every worker process, the enrolment and the baseline read the same splits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape

HELD_OUT_NOTE = "a seeded 10 % of the file held out (seed 13) as its test split"


@dataclass(frozen=True)
class Dataset:
    """The data set a simulation runs on: its packed folder, name and task, labels, template, label words."""

    folder: Path
    name: str
    task: str
    labels: tuple[str, ...] = ()
    template: str | None = None
    verbalizer: tuple[tuple[str, ...], ...] | None = None
    note: str = ""


def data_source(opts: Any) -> Any:
    """The worker's DataSource for simulate's (or train-local's) data options."""
    from fedprompt.worker.data import DataSource, parse_labels

    return DataSource(
        data=str(opts.dataset),
        test_data=str(opts.test_data) if getattr(opts, "test_data", None) else None,
        text_column=getattr(opts, "text_column", None) or "text",
        label_column=getattr(opts, "label_column", None) or "label",
        text_b_column=getattr(opts, "text_b_column", None) or None,
        labels=parse_labels(getattr(opts, "labels", None)),
    )


def resolve_data(opts: Any, out: Path) -> Dataset:
    """The simulation's data set, template and label words, or a DataError / LabelWordError that says
    what is wrong in one line. A file is packed into <out>/data/<name> only once everything is checked."""
    from fedprompt.worker.data import choose_prompt, load_splits, resolve_dataset
    from fedprompt.worker.data.pack import write_packed
    from fedprompt.worker.data.verbalizer import load_tokenizer
    from fedprompt.worker.naming import own_data_name

    src = data_source(opts)
    splits = None
    if not src.is_table and src.test_data is None:
        folder = resolve_dataset(src.data)
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        name, labels, task = folder.name, tuple(meta.get("labels") or ()), meta.get("task", "single")
    else:
        splits = load_splits(src)
        name = own_data_name(src.data, getattr(opts, "data_name", None)) if src.is_table else splits.name
        labels, task = tuple(splits.train.label_names), splits.train.task
        folder = out / "data" / name
    template, words = choose_prompt(
        name=name,
        task=task,
        label_names=labels,
        template=opts.template,
        verbalizer=opts.verbalizer,
        tokenizer=load_tokenizer(opts.model),
        model=opts.model,
    )
    note = ""
    if splits is not None:
        origin = src.data + (f" + {src.test_data}" if src.test_data else "")
        note = f"packed by fedprompt simulate from {origin}" + (
            f"; {HELD_OUT_NOTE}" if splits.held_out else ""
        )
        write_packed(folder, splits.train, splits.test, name=name, source=note, origin=origin, overwrite=True)
    return Dataset(
        folder=folder,
        name=name,
        task=task,
        labels=labels,
        template=template,
        verbalizer=tuple(tuple(w) for w in words),
        note=note,
    )


def shard_lines(dataset: Dataset, opts: Any, seed: int | None = None) -> list[str]:
    """What each client gets, one line each: train and eval examples and the train label mix. With
    `opts.evaluators`, the test split is the first ones' only, as the run deals it."""
    from fedprompt.worker.shards import ShardSpec, shard_summary

    summary = shard_summary(
        ShardSpec(
            data=str(dataset.folder),
            partition=opts.partition,
            num_partitions=opts.clients,
            seed=opts.seed if seed is None else seed,
            train_limit=opts.train_limit,
            eval_limit=opts.eval_limit,
            eval_shares=getattr(opts, "evaluators", None),
        )
    )
    lines = []
    for i, shard in enumerate(summary):
        train, per_label = shard["train"], shard["per_label"]
        total = max(1, train)
        mix = ", ".join(f"{name} {100 * n / total:.0f} %" for name, n in per_label.items())
        lines.append(f"  client-{i}: {train} train ({mix}), {shard['eval']} eval")
    return lines


def print_data(console: Any, dataset: Dataset, opts: Any) -> None:
    """The data set, its template and label words, and every client's shard, before the run starts."""
    words = "; ".join(",".join(w) for w in dataset.verbalizer or ())
    console.print(
        escape(
            f"data {dataset.name} ({dataset.task}; labels {', '.join(dataset.labels)}) from {dataset.folder}"
            + (f" ({dataset.note})" if dataset.note else "")
        ),
        soft_wrap=True,
    )
    console.print(escape(f"template {dataset.template!r}, label words {words}"), soft_wrap=True)
    console.print(f"{opts.clients} clients, partition {escape(opts.partition)}:", soft_wrap=True)
    for line in shard_lines(dataset, opts):
        console.print(escape(line), soft_wrap=True)
