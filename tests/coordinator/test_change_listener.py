"""The change announcements' listener (Postgres LISTEN/NOTIFY) on the real server."""

from __future__ import annotations

import psycopg
import pytest
from fedprompt.coordinator.persistence.notify import ChangeListener, conninfo
from fedprompt.coordinator.persistence.store import CHANNEL
from sqlalchemy.engine import make_url

from tests.helpers import wait_for

pytestmark = pytest.mark.postgres


def test_an_announcement_arrives_and_stop_ends_the_wait_at_once(pg_url: str) -> None:
    """A poll interval far longer than the join's timeout: the thread ends only if stop() wakes it."""
    url = make_url(pg_url)
    heard: list[int] = []
    listener = ChangeListener(url, heard.append, poll_s=600.0)
    listener.start()
    try:
        with psycopg.connect(conninfo(url), autocommit=True) as conn:

            def announced() -> bool:  # announced until heard: the listener may still be connecting
                conn.execute("SELECT pg_notify(%s, '7')", [CHANNEL])
                return bool(heard)

            wait_for(announced, 30, "the announcement", interval=0.2)
        assert set(heard) == {7}
    finally:
        listener.stop(timeout=30)
    assert not listener.running
