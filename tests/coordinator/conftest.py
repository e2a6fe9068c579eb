"""Fixtures for the coordinator: a migrated database and a service with a controllable clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from fedprompt.coordinator.app import create_app
from fedprompt.coordinator.config import Settings
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.service import Coordinator

from tests.helpers import ADMIN

LIMIT = 4096  # the API fixture's upload limit, small so 413 is cheap to provoke


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# db_url is at head for a test using `engine` or `api` (tests/conftest.py, AT_HEAD): a copy of a database
# migrated once, so neither migrates again.
@pytest.fixture
def engine(db_url: str) -> Iterator:  # type: ignore[type-arg]
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def service(engine, clock: FakeClock) -> Coordinator:  # type: ignore[no-untyped-def]
    return Coordinator(make_sessionmaker(engine), clock=clock)


@pytest.fixture
def api(db_url: str, tmp_path) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    settings = Settings(database_url=db_url, admin_token=ADMIN, data_dir=tmp_path, max_upload_bytes=LIMIT)
    with TestClient(create_app(settings, sweep=False)) as client:
        yield client
