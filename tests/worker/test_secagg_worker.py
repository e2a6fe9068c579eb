"""The worker's secure-aggregation state: secrets and the masked vector are kept (0600) before they are
used, so a restarted worker answers with the same keys and never makes a second masked vector."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
from fedprompt.shared.secagg.protocol import PeerKeys, RoundSecrets
from fedprompt.worker.secagg import SecureStages


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_survive_a_restart_and_are_private(tmp_path: Path) -> None:
    first = SecureStages(tmp_path, 1)
    keys = first.answer({"stage": "keys", "round": 3, "attempt": 1})
    again = SecureStages(tmp_path, 1).answer({"stage": "keys", "round": 3, "attempt": 1})
    assert keys == again
    kept = tmp_path / "secagg" / "3-1.json"
    assert _mode(kept) == 0o600 and _mode(tmp_path / "secagg") == 0o700
    other = SecureStages(tmp_path, 1).answer({"stage": "keys", "round": 3, "attempt": 2})
    assert other != keys
    SecureStages(tmp_path, 1).secrets_for(4, 1)  # a later round: the earlier files go
    assert not kept.exists()


def test_one_masked_vector_per_round(tmp_path: Path) -> None:
    peer = RoundSecrets.new()
    peer_keys = peer.advertisement()
    task = {
        "round": 2,
        "attempt": 1,
        "secure_aggregation": {
            "attempt": 1,
            "index": 1,
            "t": 1,
            "envelopes": {"2": "AA=="},
            "peers": {"2": peer_keys},
            "clip": 1.0,
            "bits": 16,
        },
    }
    PeerKeys.from_json(peer_keys)
    stages = SecureStages(tmp_path, 1)
    body = stages.masked(task, np.zeros(8), 5, {"loss": 1.0})
    again = SecureStages(tmp_path, 1).masked(task, np.ones(8), 5, {"loss": 2.0})
    assert again == body
    assert _mode(tmp_path / "secagg" / "2-1.masked") == 0o600
