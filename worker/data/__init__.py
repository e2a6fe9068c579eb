"""Data for the worker: packed data sets, a user's own tables, presets and label words, client partitions."""

from fedprompt.worker.data.dataset import (
    DATASETS_ENV,
    DataError,
    Example,
    MissingDataset,
    TextDataset,
    dataset_dirs,
    datasets_dir,
    load_dataset,
    load_table,
    packed_folders,
    resolve_dataset,
    user_datasets_dir,
)
from fedprompt.worker.data.partition import (
    PartitionError,
    Scheme,
    iid,
    label_dirichlet,
    parse_partition,
    partition,
    quantity_dirichlet,
)
from fedprompt.worker.data.presets import PRESETS, Preset, generic_template, preset_for
from fedprompt.worker.data.source import DataSource, Splits, is_table, load_source, load_splits, parse_labels
from fedprompt.worker.data.verbalizer import LabelWordError, choose_prompt, parse_verbalizer

__all__ = [
    "DATASETS_ENV",
    "PRESETS",
    "DataError",
    "DataSource",
    "Example",
    "LabelWordError",
    "MissingDataset",
    "PartitionError",
    "Preset",
    "Scheme",
    "Splits",
    "TextDataset",
    "choose_prompt",
    "dataset_dirs",
    "datasets_dir",
    "generic_template",
    "iid",
    "is_table",
    "label_dirichlet",
    "load_dataset",
    "load_source",
    "load_splits",
    "load_table",
    "packed_folders",
    "parse_labels",
    "parse_partition",
    "parse_verbalizer",
    "partition",
    "preset_for",
    "quantity_dirichlet",
    "resolve_dataset",
    "user_datasets_dir",
]
