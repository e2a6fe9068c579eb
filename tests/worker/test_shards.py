"""Which worker holds which evaluation examples: the test split dealt to every worker, or only to the
first E (the federation's `evaluators`), on the built-in SST-2."""

from __future__ import annotations

from dataclasses import replace

import pytest
from fedprompt.worker.data import DataError
from fedprompt.worker.shards import ShardSpec, load_shards, shard_sizes

SPEC = ShardSpec(data="sst2", num_partitions=4, seed=3, train_limit=200, eval_limit=120)


def _texts(spec: ShardSpec) -> list[tuple[set[str], set[str]]]:
    shards = load_shards([replace(spec, partition_id=i) for i in range(spec.num_partitions)])
    return [({e.text for e in train}, {e.text for e in evaluation}) for train, evaluation, _ in shards]


def test_the_first_e_workers_share_the_whole_test_split_and_the_others_hold_none() -> None:
    everyone, first_two = _texts(SPEC), _texts(replace(SPEC, eval_shares=2))
    assert [len(ev) for _, ev in first_two][2:] == [0, 0]
    assert first_two[0][1] | first_two[1][1] == set().union(*(ev for _, ev in everyone))
    assert not first_two[0][1] & first_two[1][1]
    # the training shards do not change: the test split is not cut from them
    assert [train for train, _ in first_two] == [train for train, _ in everyone]
    sizes = shard_sizes(replace(SPEC, eval_shares=2))
    assert [e for _, e in sizes][2:] == [0, 0] and sum(e for _, e in sizes) == 120


def test_held_out_evaluation_is_cut_only_from_the_evaluators_training_shards() -> None:
    held = replace(SPEC, eval_fraction=0.25, eval_shares=1)
    sizes, plain = shard_sizes(held), shard_sizes(replace(SPEC, eval_fraction=0.25))
    assert sizes[0] == plain[0] and sizes[0][1] > 0
    assert all(
        e == 0 and t == plain_t + plain_e
        for (t, e), (plain_t, plain_e) in zip(sizes[1:], plain[1:], strict=True)
    )


@pytest.mark.parametrize("shares", [0, 5])
def test_more_evaluators_than_workers_or_none_is_refused(shares: int) -> None:
    with pytest.raises(DataError, match="eval shares must be in 1..4"):
        shard_sizes(replace(SPEC, eval_shares=shares))
