"""The answers a worker and the CLI act on, read through CoordinatorClient from the real coordinator: each
comes back as its shared/contract.py model (a federation's status, enrolment, each kind of task with its
training settings, the receipts), so the coordinator's answers and the client's models agree."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.contract import (
    DoneTask,
    Enrolled,
    EvaluateTask,
    FederationStatus,
    TrainConfig,
    TrainTask,
    UploadReceipt,
)
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.spec_options import label_skew_default
from fedprompt.shared.vocab import FederationState, TaskKind

from tests.helpers import ADMIN, SMALL_SPEC, update_blob


def _client(api: TestClient, token: str | None) -> CoordinatorClient:
    """A CoordinatorClient whose requests go to the in-process app."""
    client = CoordinatorClient("http://testserver", token)
    client.http.close()
    client.http = TestClient(api.app, base_url="http://testserver")
    if token:
        client.http.headers["Authorization"] = f"Bearer {token}"
    return client


@pytest.fixture
def admin(api: TestClient) -> Iterator[CoordinatorClient]:
    with _client(api, ADMIN) as client:
        yield client


def test_a_federation_s_answers_come_back_as_the_contract_s_models(
    api: TestClient, admin: CoordinatorClient
) -> None:
    spec: dict[str, Any] = {**SMALL_SPEC, "rounds": 1, "local_epochs": 2.0, "seed": 5}
    created = admin.create_federation(spec)
    assert isinstance(created, FederationStatus) and created.state == FederationState.WAITING
    fid = created.id
    token = admin.create_enrollment_token(fid, max_uses=2)
    sites = []
    for i in range(2):
        enrolled = _client(api, None).enroll(fid, token, name=f"site-{i}", num_samples=10, info={})
        assert isinstance(enrolled, Enrolled) and enrolled.federation_id == fid
        assert FederationSpec.model_validate(enrolled.spec).local_epochs == 2.0
        sites.append(_client(api, enrolled.token))

    for site in sites:
        first = site.task(fid)
        assert isinstance(first, EvaluateTask) and first.kind == TaskKind.EVALUATE and first.version == 0
        assert site.report_evaluation(fid, 0, {"num_samples": 10, "accuracy": 0.5}).stored

    status = admin.federation(fid)
    assert status.open_round is not None and status.open_round.round == 1
    assert [p.uploaded for p in status.open_round.participants] == [False, False]
    assert status.model_extra is not None and "ledger" in status.model_extra  # undescribed members kept

    for i, site in enumerate(sites):
        train = site.task(fid)
        assert isinstance(train, TrainTask) and (train.round, train.attempt, train.version) == (1, 1, 0)
        assert train.secure_aggregation is None and train.sha256 == site.prompt(fid, 0).sha256
        assert train.config == TrainConfig(
            local_steps=100,
            local_epochs=2.0,
            batch_size=16,
            lr=train.config.lr,
            grad_clip=1.0,
            seed=5,
            drift_correction=label_skew_default().model_dump(),  # the spec's default
        )
        code, receipt = site.upload(fid, 1, update_blob(SMALL_SPEC, i, base_version=0))
        assert code == 201 and isinstance(receipt, UploadReceipt)
        assert (receipt.round, receipt.attempt, receipt.num_samples) == (1, 1, 10)

    assert admin.federation(fid).state == FederationState.COMPLETED
    for site in sites:
        last = site.task(fid)
        assert isinstance(last, EvaluateTask) and last.version == 1
        site.report_evaluation(fid, 1, {"num_samples": 10, "accuracy": 0.6})
        assert isinstance(site.task(fid), DoneTask)
    assert [f.id for f in admin.federations()] == [fid]
