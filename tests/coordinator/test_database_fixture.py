"""The `engine` fixture's database (tests/conftest.py, AT_HEAD): at head and without rows at every test's
start, on both backends, although on Postgres one database serves every test of a worker."""

from __future__ import annotations

import pytest
from fedprompt.coordinator.persistence.db import Base
from fedprompt.coordinator.persistence.migrate import schema_is_current
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared.spec import FederationSpec
from sqlalchemy import func, select

from tests.helpers import SMALL_SPEC


@pytest.mark.parametrize("turn", [1, 2])
def test_each_test_starts_at_head_with_no_rows_and_ids_from_one(
    engine, service: Coordinator, turn: int
) -> None:  # type: ignore[no-untyped-def]
    """The second turn runs after the first has written a federation: its row must be gone, and the new
    federation's id is 1 again (the sequences restart), as in a database made for the test."""
    assert schema_is_current(engine)
    with engine.connect() as conn:
        counts = {
            t.name: conn.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables
        }
    assert set(counts.values()) == {0}, counts
    fid = service.federations.create_federation(FederationSpec.model_validate(SMALL_SPEC)).id
    assert fid == 1
