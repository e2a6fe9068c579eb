"""Training batches: the seeded endless order, and examples of similar length batched together
(worker/engine/batching.py), with literal lengths."""

from __future__ import annotations

import numpy as np
from fedprompt.worker.engine.batching import cycle_batches, length_batches


def test_a_window_is_cut_into_batches_of_similar_length_in_a_random_order() -> None:
    lengths = [9, 3, 7, 1, 8, 2, 6, 4]
    batches = length_batches(lengths, 2, np.random.default_rng(0))
    # by length: 1 2 | 3 4 | 6 7 | 8 9, each pair together, the four pairs shuffled
    assert sorted(sorted(lengths[i] for i in b) for b in batches) == [[1, 2], [3, 4], [6, 7], [8, 9]]
    assert sorted(int(i) for b in batches for i in b) == list(range(8))  # each position once
    firsts = {
        min(lengths[i] for i in length_batches(lengths, 2, np.random.default_rng(s))[0]) for s in range(20)
    }
    assert firsts == {1, 3, 6, 8}  # any pair may come first: the short ones are not always first


def test_equal_lengths_keep_the_windows_order_and_a_short_last_batch_stays() -> None:
    batches = length_batches([5, 5, 5, 5, 5], 2, np.random.default_rng(1))
    assert sorted(len(b) for b in batches) == [1, 2, 2]
    assert sorted(tuple(int(i) for i in b) for b in batches) == [(0, 1), (2, 3), (4,)]


def test_padding_falls_on_a_mix_of_lengths() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(10, 64, size=256)
    order = cycle_batches(len(lengths), 16, np.random.default_rng(3))
    plain = [next(order) for _ in range(8)]
    window = np.concatenate(plain)
    grouped = [window[b] for b in length_batches(lengths[window].tolist(), 16, rng)]

    def padded(batches: list[np.ndarray]) -> int:
        return sum(int(lengths[b].max()) * len(b) for b in batches)

    assert sorted(window.tolist()) == sorted(np.concatenate(grouped).tolist())  # the same examples
    assert padded(grouped) < 0.8 * padded(plain)
