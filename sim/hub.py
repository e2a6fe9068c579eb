"""The paper's eight data sets on the Hugging Face hub, mapped to the packed format (`fedprompt data fetch`).

Each entry says which hub repository (and configuration or files) holds the set, which hub splits make
the packed train and test splits (the paper evaluates on each task's validation split where the test
split has no labels), which columns hold the text(s) and the label, and the label names in id order.
The `datasets` library is imported only here and only when fetching (the `data` extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedprompt.worker.data import DataError, Example, TextDataset
from fedprompt.worker.data.dataset import Task
from fedprompt.worker.data.pack import write_packed

OFFLINE_VALUES = {"1", "on", "yes", "true"}


class FetchError(DataError):
    """A data set that cannot be fetched (offline, no network, no `datasets`); the message is one line."""


@dataclass(frozen=True)
class HubSet:
    """Where one of the paper's data sets lives on the hub and how its rows map to packed rows."""

    repo: str
    config: str | None
    labels: tuple[str, ...]
    train: tuple[str, ...]
    test: tuple[str, ...]
    # a column name, or an int: that column by position (files whose header names vary)
    text: str | int
    label: str | int
    text_b: str | None = None
    data_files: dict[str, list[str]] | None = None
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def task(self) -> Task:
        """single or pair."""
        return "pair" if self.text_b else "single"


GLUE = "nyu-mll/glue"
OPENBACKDOOR = "ganqu/openbackdoor"
VALIDATION_AS_TEST = (
    "test = the official validation split (the test split has no labels), as in the FedPrompt paper"
)

HUB_SETS: dict[str, HubSet] = {
    "sst2": HubSet(
        GLUE,
        "sst2",
        ("negative", "positive"),
        ("train",),
        ("validation",),
        text="sentence",
        label="label",
        source=f"GLUE SST-2 (Socher et al. 2013); {VALIDATION_AS_TEST}",
    ),
    "imdb": HubSet(
        "stanfordnlp/imdb",
        None,
        ("negative", "positive"),
        ("train",),
        ("test",),
        text="text",
        label="label",
        source="Large Movie Review Dataset v1.0 (Maas et al. 2011), official 25k/25k split",
    ),
    "offenseval": HubSet(
        "cardiffnlp/tweet_eval",
        "offensive",
        ("not_offensive", "offensive"),
        ("train", "validation"),
        ("test",),
        text="text",
        label="label",
        source="OffensEval 2019 (Zampieri et al. 2019) as TweetEval's 'offensive'; train = its train + "
        "validation (the official OLID training set), test = the official test set",
    ),
    "twitter": HubSet(
        OPENBACKDOOR,
        None,
        ("normal", "abusive"),
        ("train",),
        ("test",),
        text=0,
        label=-1,
        data_files={"train": ["twitter/train.tsv"], "test": ["twitter/test.tsv"]},
        load_kwargs={"sep": "\t"},
        source="Twitter abusive language (Founta et al. 2018) as OpenBackdoor distributes it",
    ),
    "enron": HubSet(
        "SetFit/enron_spam",
        None,
        ("ham", "spam"),
        ("train",),
        ("test",),
        text="text",
        label="label",
        source="Enron-Spam (Metsis et al. 2006) as SetFit/enron_spam, its train/test split",
    ),
    "lingspam": HubSet(
        OPENBACKDOOR,
        None,
        ("ham", "spam"),
        ("train",),
        ("test",),
        text=0,
        label=-1,
        data_files={"train": ["lingspam/**/train.tsv"], "test": ["lingspam/**/test.tsv"]},
        load_kwargs={"sep": "\t"},
        source="Ling-Spam (Androutsopoulos et al. 2000) as OpenBackdoor distributes it",
    ),
    "qnli": HubSet(
        GLUE,
        "qnli",
        ("entailment", "not_entailment"),
        ("train",),
        ("validation",),
        text="question",
        text_b="sentence",
        label="label",
        source=f"GLUE QNLI; {VALIDATION_AS_TEST}",
    ),
    "rte": HubSet(
        GLUE,
        "rte",
        ("entailment", "not_entailment"),
        ("train",),
        ("validation",),
        text="sentence1",
        text_b="sentence2",
        label="label",
        source=f"GLUE RTE; {VALIDATION_AS_TEST}",
    ),
}


def offline() -> str | None:
    """The variable that puts this machine offline for the hub (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE), or None."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in OFFLINE_VALUES:
            return f"{var}={os.environ[var]}"
    return None


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise FetchError(
            "`fedprompt data fetch` needs the datasets library: pip install 'fedprompt[data]' "
            "(or datasets); without it, point $FEDPROMPT_DATASETS at packed data sets or pass a CSV/TSV/JSONL file"
        ) from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _column(columns: list[str], want: str | int, name: str, what: str) -> str:
    if isinstance(want, int):
        return columns[want]
    if want not in columns:
        raise FetchError(
            f"{name}: the hub's rows have no {what} column {want!r} (they have {', '.join(columns)})"
        )
    return want


def _split(hub: HubSet, name: str, loaded: Any, splits: tuple[str, ...], target: str) -> TextDataset:
    """The packed split `target` from the hub splits `splits` (rows without a label are left out)."""
    examples: list[Example] = []
    for split in splits:
        if split not in loaded:
            raise FetchError(f"{name}: the hub copy has no {split!r} split (it has {', '.join(loaded)})")
        part = loaded[split]
        columns = list(part.column_names)
        text = _column(columns, hub.text, name, "text")
        label = _column(columns, hub.label, name, "label")
        text_b = _column(columns, hub.text_b, name, "second text") if hub.text_b else None
        texts = list(part[text])
        texts_b = list(part[text_b]) if text_b else [None] * len(texts)
        for value, first, second in zip(list(part[label]), texts, texts_b, strict=True):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value.strip())
            if isinstance(value, str) and value.strip() in hub.labels:
                value = hub.labels.index(value.strip())
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                continue  # GLUE's unlabelled rows carry -1
            if value >= len(hub.labels):
                raise FetchError(
                    f"{name}: a {split} row has label {value}; expected ids 0..{len(hub.labels) - 1}"
                )
            examples.append(Example(str(first or ""), value, str(second or "") if text_b else None))
    if not examples:
        raise FetchError(f"{name}: the hub's {'+'.join(splits)} split(s) have no labelled rows for {target}")
    return TextDataset(examples, list(hub.labels), hub.task, name)


def fetch(
    name: str,
    dest: Path,
    *,
    source: str | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Download `name` from the hub (or load it from `source`: a local copy in the hub's layout, or
    another hub repository) and write it packed into dest/name; returns its meta.json."""
    if name not in HUB_SETS:
        raise FetchError(f"no hub mapping for {name!r}; fetch one of {', '.join(HUB_SETS)}")
    hub = HUB_SETS[name]
    folder = dest / name
    if folder.exists() and not force:
        raise FetchError(f"{folder} already exists; pass --force to fetch it again")
    repo = source or hub.repo
    local = Path(repo).exists()
    if not local and (var := offline()):
        raise FetchError(
            f"offline ({var}): fetching {name} needs the Hugging Face hub; on this machine point "
            f"$FEDPROMPT_DATASETS at a folder of packed data sets, or pass a CSV/TSV/JSONL file"
        )
    datasets = _datasets()
    kwargs: dict[str, Any] = dict(hub.load_kwargs)
    if hub.data_files:
        kwargs["data_files"] = hub.data_files
    try:
        cache = cache_dir or os.environ.get("HF_DATASETS_CACHE")  # read now, not when datasets was imported
        loaded = datasets.load_dataset(
            str(repo), hub.config, cache_dir=str(cache) if cache else None, **kwargs
        )
    except Exception as exc:  # network, hub and layout errors of many kinds: one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        where = str(repo) if local else f"the Hugging Face hub ({repo})"
        raise FetchError(
            f"cannot load {name} from {where}: {type(exc).__name__}{': ' + first if first else ''}; "
            f"offline, point $FEDPROMPT_DATASETS at a folder of packed data sets"
        ) from None
    train = _split(hub, name, loaded, hub.train, "train")
    test = _split(hub, name, loaded, hub.test, "test")
    config = f" (config {hub.config})" if hub.config else ""
    splits = f"train = {'+'.join(hub.train)}, test = {'+'.join(hub.test)}"
    origin = (f"{repo}" if local else f"huggingface.co/datasets/{repo}") + f"{config}; {splits}"
    return write_packed(
        folder,
        train,
        test,
        name=name,
        source=hub.source,
        origin=origin,
        extra={"fetched_by": "fedprompt data fetch"},
        overwrite=force,
    )
