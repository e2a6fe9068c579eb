"""Batches: padding token rows, checked label ids and the seeded endless batch order of training, with
examples of similar length batched together (less padding)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch


def pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, attention mask), right-padded to the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def label_ids(examples: Sequence[Any], num_labels: int) -> torch.Tensor:
    """The examples' labels as a long tensor; ValueError for one outside 0..num_labels - 1."""
    labels = torch.tensor([int(ex.label) for ex in examples], dtype=torch.long)
    bad = (labels < 0) | (labels >= num_labels)
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"example {first} has label {int(labels[first])}; the verbalizer has "
            f"{num_labels} labels (0..{num_labels - 1})"
        )
    return labels


def cycle_batches(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Endless batches over a fresh permutation per epoch; a batch may span two epochs."""
    order = rng.permutation(n)
    at = 0
    while True:
        if at + batch_size <= n:
            yield order[at : at + batch_size]
            at += batch_size
            continue
        head = order[at:]
        order = rng.permutation(n)
        need = min(batch_size, n) - len(head)
        yield np.concatenate([head, order[:need]])
        at = need


# How many batches' worth of the seeded order is sorted by length at a time (the share of real tokens
# in a batch's positions, random and grouped, is measured by bench.worker).
LENGTH_WINDOW = 8


def length_batches(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A window of examples cut into batches of similar length: positions into `lengths`, sorted by
    length (stably, so equal lengths keep the window's random order), cut every `batch_size`, the
    batches in a seeded random order (so long and short batches alternate at random)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[j] for j in rng.permutation(len(batches))]
