"""The wire contract's models (shared/contract.py): one task model per kind of the vocabulary, told apart
by "kind"; members a model does not describe are kept; a kind the client does not know is refused."""

from __future__ import annotations

import typing

import httpx
import pytest
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.contract import SecaggTask, Task, TaskAnswer, TrainTask
from fedprompt.shared.vocab import SecureStage, TaskKind
from pydantic import ValidationError

TRAIN = {
    "kind": "train",
    "round": 2,
    "attempt": 1,
    "version": 1,
    "sha256": "ab" * 32,
    "deadline_at": 1.5e9,
    "config": {
        "local_steps": 10,
        "local_epochs": None,
        "batch_size": 4,
        "lr": 0.3,
        "grad_clip": 1.0,
        "seed": 7,
    },
}


def test_there_is_one_task_model_per_kind() -> None:
    union = typing.get_args(typing.get_args(TaskAnswer)[0])
    kinds = [typing.get_args(model.model_fields["kind"].annotation)[0] for model in union]
    assert sorted(kinds) == sorted(TaskKind)


def test_a_train_task_reads_its_settings_and_keeps_what_it_does_not_describe() -> None:
    task = Task.model_validate({**TRAIN, "hint": "newer"}).root
    assert isinstance(task, TrainTask) and task.kind is TaskKind.TRAIN
    assert (task.config.local_steps, task.config.lr, task.config.seed) == (10, 0.3, 7)
    assert task.model_extra == {"hint": "newer"}
    assert task.model_dump(mode="json", exclude_unset=True) == {**TRAIN, "hint": "newer"}  # as sent


def test_an_older_train_configuration_takes_the_defaults() -> None:
    config = {"local_steps": 3, "batch_size": 2, "lr": 0.1}
    task = Task.model_validate({**TRAIN, "config": config}).root
    assert isinstance(task, TrainTask)
    assert (task.config.local_epochs, task.config.grad_clip, task.config.seed) == (None, 1.0, 0)


def test_a_secagg_task_keeps_its_stage_s_members() -> None:
    raw = {"kind": "secagg", "stage": "keys", "round": 3, "attempt": 1, "version": 2, "deadline_at": 9.0}
    task = Task.model_validate({**raw, "index": 2, "t": 3, "client_id": 5}).root
    assert isinstance(task, SecaggTask) and task.stage is SecureStage.KEYS
    assert task.model_dump(exclude_unset=True) == {**raw, "index": 2, "t": 3, "client_id": 5}


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "rest", "round": 1, "version": 1},  # a kind this client does not know
        {"kind": "train", "round": 1, "version": 0},  # a train task without its settings
        {"kind": "secagg", "stage": "masked", "round": 1, "attempt": 1, "version": 0, "deadline_at": 1.0},
    ],
)
def test_a_task_the_client_cannot_read_is_refused(body: dict[str, object]) -> None:
    client = CoordinatorClient(
        "http://coordinator.test",
        "t",
        transport=httpx.MockTransport(lambda _: httpx.Response(200, json=body)),
    )
    with pytest.raises(ValidationError):
        client.task(1)
