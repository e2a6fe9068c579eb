"""Data for the worker: packed data sets, a user's own tables, presets and client partitions."""

from worker.data.dataset import (
    DATASETS_ENV,
    DataError,
    Example,
    TextDataset,
    datasets_dir,
    load_dataset,
    load_table,
    project_root,
    resolve_dataset,
)
from worker.data.partition import (
    PartitionError,
    Scheme,
    iid,
    label_dirichlet,
    parse_partition,
    partition,
    quantity_dirichlet,
)
from worker.data.presets import PRESETS, Preset, preset_for

__all__ = [
    "DATASETS_ENV",
    "PRESETS",
    "DataError",
    "Example",
    "PartitionError",
    "Preset",
    "Scheme",
    "TextDataset",
    "datasets_dir",
    "iid",
    "label_dirichlet",
    "load_dataset",
    "load_table",
    "parse_partition",
    "partition",
    "preset_for",
    "project_root",
    "quantity_dirichlet",
    "resolve_dataset",
]
