"""free_port: a port outside the range the kernel hands to outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fedprompt.shared import local


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    monkeypatch.setattr(local, "_EPHEMERAL_RANGE", ranges)
    for _ in range(20):
        port = local.free_port()
        assert 10000 <= port < 40000
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_a_server_listens_on_is_never_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        taken = listening.getsockname()[1]
        # the taken port first, then real draws (a fixed second port may be in use on a busy machine)
        draw = local.random.SystemRandom.randrange
        offers = iter([taken])
        monkeypatch.setattr(
            local.random.SystemRandom, "randrange", lambda self, a, b: next(offers, None) or draw(self, a, b)
        )
        monkeypatch.setattr(local, "_ephemeral_floor", lambda: 65535)
        assert local.free_port() != taken


def test_an_unreadable_range_falls_back_to_linux_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert local._ephemeral_floor() == 32768
