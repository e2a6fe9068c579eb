"""The coordinator's pure rules with literal inputs: upload checks and weights, which versions are
evaluated, round statistics, the LDP record, and the upload paths."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from fedprompt.coordinator.errors import Conflict, Forbidden, Gone, NotFound
from fedprompt.coordinator.hosting.paths import UPLOAD_PATHS, UPLOAD_ROUTE
from fedprompt.coordinator.logic.evaluation import asked_to_evaluate, evaluation_due
from fedprompt.coordinator.logic.roundstats import privacy_record, round_stats
from fedprompt.coordinator.logic.uploads import (
    PendingUpload,
    Selection,
    StoredUpdate,
    check_update,
    weight,
)
from fedprompt.shared.contract import UploadReceipt
from fedprompt.shared.spec_options import PrivacySpec

OPEN = SimpleNamespace(id=7, attempt=2, state="open", base_version=3)
FAILED = SimpleNamespace(id=6, attempt=1, state="failed", base_version=3)


def _item(
    client_id: int = 1, digest: str = "d1", num_samples: int = 50, base: str | None = "3"
) -> PendingUpload:
    return PendingUpload(4, client_id, b"x" * 10, digest, num_samples, {}, base)


def _check(item: PendingUpload, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "attempts": [OPEN, FAILED],
        "stored": {},
        "selected": {(7, 1): Selection(None, 20)},
        "current_round": 4,
    } | kw
    return check_update(item, **args)


def test_an_accepted_update_weighs_at_most_its_enrolled_samples() -> None:
    result = _check(_item(num_samples=50))
    assert result.created and (result.round, result.attempt, result.client_id) == (4, 2, 1)
    assert result.num_samples == 20 and result.size == 10
    assert _check(_item(num_samples=5)).num_samples == 5  # fewer than enrolled: as declared
    assert weight(5, 0) == 1 and weight(5, 3) == 3 and weight(2, 3) == 2  # never below one


def test_an_identical_resend_answers_as_stored_in_whichever_attempt() -> None:
    stored = {(6, 1): StoredUpdate("d1", 9, 99)}
    result = _check(_item(), stored=stored)
    assert not result.created and (result.attempt, result.num_samples, result.size) == (1, 9, 99)
    assert result.receipt().model_dump() == {
        "round": 4,
        "attempt": 1,
        "client_id": 1,
        "sha256": "d1",
        "num_samples": 9,
        "size": 99,
    }


@pytest.mark.parametrize(
    ("kw", "item", "error"),
    [
        ({"attempts": []}, _item(), NotFound),
        ({"attempts": [SimpleNamespace(id=7, attempt=2, state="closed", base_version=3)]}, _item(), Gone),
        ({"stored": {(7, 1): StoredUpdate("other", 20, 10)}}, _item(), Conflict),
        ({"selected": {}}, _item(), Forbidden),
        ({"selected": {(7, 1): Selection(123.0, 20)}}, _item(), Forbidden),
        ({}, _item(base="2"), Conflict),
    ],
)
def test_refused_updates_say_why(kw: dict[str, Any], item: PendingUpload, error: type[Exception]) -> None:
    with pytest.raises(error):
        _check(item, **kw)


def test_the_receipt_is_the_api_answer() -> None:
    assert list(_check(_item()).receipt().model_dump()) == list(UploadReceipt.model_fields)


@pytest.mark.parametrize(
    ("version", "every", "rounds", "due"),
    [
        (0, 5, 10, True),
        (1, 1, 10, True),
        (3, 2, 10, False),
        (4, 2, 10, True),
        (9, 4, 9, True),
        (7, 4, 9, False),
    ],
)
def test_evaluations_are_due_for_version_0_every_nth_and_the_last(
    version: int, every: int, rounds: int, due: bool
) -> None:
    assert evaluation_due(version, eval_every=every, rounds=rounds) is due


def _update(cid: int, n: int, size: int, **metrics: float) -> SimpleNamespace:
    return SimpleNamespace(client_id=cid, num_samples=n, size=size, metrics=metrics)


@pytest.mark.parametrize(
    ("info", "evaluators", "rank", "asked"),
    [
        ({}, None, None, True),  # every client by default
        ({"num_eval": 40}, None, None, True),
        ({"num_eval": 0}, None, None, False),  # it said it holds no test data
        ({"num_eval": 0}, 5, 0, False),
        ({}, 2, 0, True),
        ({}, 2, 1, True),
        ({}, 2, 2, False),  # two enrolled before it
        ({"num_eval": "x"}, None, None, True),  # an unreadable figure is not taken for 0
        ({"num_eval": False}, None, None, True),
        (None, 1, 0, True),
    ],
)
def test_who_is_asked_to_evaluate(info: Any, evaluators: int | None, rank: int | None, asked: bool) -> None:
    assert asked_to_evaluate(info, evaluators, rank) is asked


def test_round_stats_weigh_the_loss_and_note_rejections_and_clipped_weights() -> None:
    updates = [
        _update(3, 10, 100, loss=1.0, steps=25),
        _update(5, 30, 100, loss=3.0, local_asr=0.9, local_accuracy=0.6, steps=75),
    ]
    stats = round_stats(
        updates,
        [40, 0, 40],
        notes={1: "rejected by krum"},
        declared={3: 10, 5: 300},
        aggregation_s=0.5,
    )
    assert stats == {
        "participants": 3,
        "updates": 2,
        "num_samples": 40,
        "bytes_up": 200,
        "bytes_down": 80,
        "train_loss": pytest.approx(2.5),
        "notes": {
            "5": "rejected by krum; num_samples 300 clipped to 30, the figure the client enrolled with"
        },
        "aggregation_s": 0.5,
        "local_asr": {"5": 0.9},
        "local_accuracy": {"5": 0.6},
        "local_steps": 100,
    }
    plain = round_stats([_update(3, 10, 1)], [1], notes={}, aggregation_s=0.0, server_optimizer={"name": "x"})
    assert plain["train_loss"] is None and plain["notes"] == {} and plain["server_optimizer"] == {"name": "x"}
    assert "local_steps" not in plain  # updates that state no steps


def test_privacy_record_composes_each_clients_releases() -> None:
    privacy = PrivacySpec(mechanism="laplace", epsilon=1.0, clip=1.0)
    record = privacy_record(privacy, {1: 2, 2: 1})
    assert record["cumulative_epsilon"] == {"1": 2.0, "2": 1.0} and record["max_cumulative_epsilon"] == 2.0
    assert privacy_record(privacy, {1: 2}, [2])["cumulative_epsilon"] == {"2": 0.0}


def test_the_upload_paths_come_from_the_route_templates() -> None:
    assert UPLOAD_ROUTE == "/api/v1/federations/{fid}/rounds/{number}/update"
    for path in ("/api/v1/federations/1/rounds/2/update", "/api/v1/federations/1/prompts/0/"):
        assert UPLOAD_PATHS.match(path), path
    for path in (
        "/api/v1/federations/1/rounds/2/close",
        "/api/v1/federations/1/prompts/1",
        "/x/rounds/2/update",
    ):
        assert not UPLOAD_PATHS.match(path), path
