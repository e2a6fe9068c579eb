"""Postgres connections dropped by the server (a restart, a failover) under a warm pool."""

from __future__ import annotations

import psycopg
import pytest
from fedprompt.coordinator.persistence.db import make_engine, make_sessionmaker
from fedprompt.coordinator.persistence.migrate import upgrade
from fedprompt.coordinator.service import Coordinator
from fedprompt.shared.spec import FederationSpec
from sqlalchemy.exc import DBAPIError

pytestmark = pytest.mark.postgres


def test_connections_killed_by_the_server_cost_at_most_one_failed_request(
    pg_url: str, pg_server: str
) -> None:
    upgrade(pg_url)
    engine = make_engine(pg_url, pool_size=4)
    try:
        service = Coordinator(make_sessionmaker(engine))
        fid = service.federations.create_federation(FederationSpec(name="restart", hidden_size=8)).id
        for _ in range(4):  # warm the pool
            service.reads.federation_status(fid)
        database = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(pg_server, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        failures = 0
        for _ in range(6):
            try:
                assert service.reads.federation_status(fid)["name"] == "restart"
            except DBAPIError as exc:
                assert exc.connection_invalidated  # recognised as a dropped connection
                failures += 1
        assert failures <= 1, failures
        service.reads.federation_status(fid)  # and it works again
    finally:
        engine.dispose()
