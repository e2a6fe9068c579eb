"""Which examples one worker trains and evaluates on: its partition of a data set, or its own file."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypedDict

from fedprompt.worker.data import DataError, DataSource, Example, TextDataset, iid, load_source, partition


@dataclass(frozen=True)
class ShardSpec:
    """How to cut one worker's data out of a data set."""

    data: str
    test_data: str | None = None
    partition: str = "iid"
    num_partitions: int = 1
    partition_id: int = 0
    seed: int = 0
    train_limit: int | None = None
    eval_limit: int | None = None
    eval_fraction: float | None = None
    # how many workers (partitions 0 … n-1) hold evaluation examples; the others evaluate nothing and
    # train on all of theirs (None: every worker; the federation's `evaluators`)
    eval_shares: int | None = None
    text_column: str = "text"
    label_column: str = "label"
    text_b_column: str | None = None
    label_names: tuple[str, ...] | None = None
    datasets_dir: str | None = None


def _hold_out(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Split off a seeded `fraction` for evaluation."""
    if not 0 < fraction < 1:
        raise DataError(f"eval fraction must be in (0, 1); got {fraction}")
    parts = iid(len(examples), 1, seed)[0]  # a seeded permutation
    cut = max(1, round(len(parts) * fraction))
    held = set(parts[:cut])
    return [e for i, e in enumerate(examples) if i not in held], [
        e for i, e in enumerate(examples) if i in held
    ]


def _source(spec: ShardSpec) -> tuple[TextDataset, TextDataset | None]:
    """(the full train split, the test split or None when evaluation is held out of train)."""
    return load_source(
        DataSource(
            data=spec.data,
            test_data=spec.test_data,
            text_column=spec.text_column,
            label_column=spec.label_column,
            text_b_column=spec.text_b_column,
            labels=spec.label_names,
            datasets_dir=spec.datasets_dir,
        )
    )


def _cut(spec: ShardSpec, full: TextDataset, test: TextDataset | None) -> tuple[list[Example], list[Example]]:
    """(train, eval) of worker `spec.partition_id`, from the loaded splits."""
    if not 0 <= spec.partition_id < spec.num_partitions:
        raise DataError(f"partition id {spec.partition_id} is outside 0..{spec.num_partitions - 1}")
    train_set = full.sample(spec.train_limit, spec.seed)
    parts = partition(train_set.labels, spec.partition, spec.num_partitions, spec.seed)
    train = [train_set.examples[i] for i in parts[spec.partition_id]]
    holders = spec.num_partitions if spec.eval_shares is None else spec.eval_shares
    if not 1 <= holders <= spec.num_partitions:
        raise DataError(f"eval shares must be in 1..{spec.num_partitions}; got {holders}")
    evaluates = spec.partition_id < holders
    if not evaluates:
        evaluation: list[Example] = []
    elif spec.eval_fraction is not None or test is None:
        train, evaluation = _hold_out(train, spec.eval_fraction or 0.1, spec.seed + spec.partition_id)
    else:
        # Each evaluating worker holds its IID share of the test split, so the sample-weighted mean
        # over them is the accuracy on the whole (limited) test split.
        test_set = test.sample(spec.eval_limit, spec.seed)
        share = iid(len(test_set), holders, spec.seed)[spec.partition_id]
        evaluation = [test_set.examples[i] for i in share]
    if not train:
        raise DataError(f"worker {spec.partition_id} of {spec.num_partitions} got no training examples")
    if evaluates and not evaluation:
        raise DataError(
            f"worker {spec.partition_id} of {spec.num_partitions} got no evaluation examples; "
            "raise --eval-limit or --eval-fraction"
        )
    return train, evaluation


def load_shard(spec: ShardSpec) -> tuple[list[Example], list[Example], TextDataset]:
    """(train, eval, the full train split) of worker `partition_id` of `num_partitions`."""
    if not 0 <= spec.partition_id < spec.num_partitions:
        raise DataError(f"partition id {spec.partition_id} is outside 0..{spec.num_partitions - 1}")
    full, test = _source(spec)
    train, evaluation = _cut(spec, full, test)
    return train, evaluation, full


def load_shards(specs: list[ShardSpec]) -> list[tuple[list[Example], list[Example], TextDataset]]:
    """`load_shard` for several shards, reading each distinct source once (a pool's clients)."""
    sources: dict[tuple[object, ...], tuple[TextDataset, TextDataset | None]] = {}
    out = []
    for spec in specs:
        key = (
            spec.data,
            spec.test_data,
            spec.text_column,
            spec.label_column,
            spec.text_b_column,
            spec.label_names,
            spec.datasets_dir,
        )
        if key not in sources:
            sources[key] = _source(spec)
        full, test = sources[key]
        train, evaluation = _cut(spec, full, test)
        out.append((train, evaluation, full))
    return out


def shard_sizes(spec: ShardSpec) -> list[tuple[int, int]]:
    """(train, eval) sizes of every worker's shard (`spec.partition_id` is ignored), loading the data once."""
    full, test = _source(spec)
    sizes = []
    for pid in range(spec.num_partitions):
        train, evaluation = _cut(replace(spec, partition_id=pid), full, test)
        sizes.append((len(train), len(evaluation)))
    return sizes


class ShardSummary(TypedDict):
    """One worker's shard: its train and eval sizes, and its train examples per label name."""

    train: int
    eval: int
    per_label: dict[str, int]


def shard_summary(spec: ShardSpec) -> list[ShardSummary]:
    """Every worker's shard (`spec.partition_id` is ignored): train and eval sizes and the train label mix."""
    full, test = _source(spec)
    out: list[ShardSummary] = []
    for pid in range(spec.num_partitions):
        train, evaluation = _cut(replace(spec, partition_id=pid), full, test)
        counts = [0] * full.num_labels
        for ex in train:
            counts[ex.label] += 1
        out.append(
            {
                "train": len(train),
                "eval": len(evaluation),
                "per_label": dict(zip(full.label_names, counts, strict=True)),
            }
        )
    return out
