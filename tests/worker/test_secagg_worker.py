"""The worker's secure-aggregation state: secrets, signing key and round records are kept (0600)
before they are used, so a restarted worker answers with the same keys and cannot be asked twice."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fedprompt.shared.secagg import signing
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.secagg.protocol import ProtocolError, unb64
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.secagg import SecureStages, evaluation_in_the_clear


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _stages(root: Path) -> SecureStages:
    return SecureStages(root, 1, 7, Policy(min_clients=3))


def test_secrets_and_signing_key_survive_a_restart_and_are_private(tmp_path: Path) -> None:
    task = {"stage": "keys", "round": 3, "attempt": 1, "index": 2}
    keys = _stages(tmp_path).answer(task)
    again = _stages(tmp_path).answer(task)
    assert keys == again  # same round keys, same (deterministic) signature
    assert signing.verify(
        unb64(keys["signing_key"]),
        signing.keys_message(b"federation=1;round=3;attempt=1", 2, 7, keys),
        unb64(keys["signature"]),
    )
    kept = tmp_path / "secagg" / "3-1.json"
    assert _mode(kept) == 0o600 and _mode(tmp_path / "secagg") == 0o700
    assert _mode(tmp_path / "secagg" / "signing.key") == 0o600
    assert _mode(tmp_path / "secagg" / "3-1.record.json") == 0o600
    with pytest.raises(ProtocolError, match="this client is number 2"):  # one number per attempt
        _stages(tmp_path).answer({**task, "index": 3})
    other = _stages(tmp_path).answer({**task, "attempt": 2})
    assert other["mask_key"] != keys["mask_key"] and other["signing_key"] == keys["signing_key"]
    _stages(tmp_path).secrets_for(4, 1)  # a later round: the earlier files go, the signing key stays
    assert not kept.exists() and (tmp_path / "secagg" / "signing.key").exists()


def test_no_masked_vector_without_shares_and_no_unmasking_without_a_signed_set(tmp_path: Path) -> None:
    stages = _stages(tmp_path)
    stages.answer({"stage": "keys", "round": 2, "attempt": 1, "index": 1})
    task = {"round": 2, "attempt": 1, "secure_aggregation": {"attempt": 1, "index": 1, "envelopes": {}}}
    with pytest.raises(ProtocolError, match="no shares"):
        stages.check_masked(task)  # before training: the agent does not train for a refused task
    with pytest.raises(ProtocolError, match="no shares"):
        stages.masked(task, [0.0] * 4, 5, {})
    with pytest.raises(ProtocolError, match="no survivor set"):
        stages.answer({"stage": "unmask", "round": 2, "attempt": 1, "index": 1, "survivors": [1, 2, 3]})


def test_evaluation_reports_leave_the_confusion_counts_out_unless_allowed() -> None:
    report = {
        "num_samples": 10,
        "accuracy": 0.5,
        "loss": 0.7,
        "metrics": {"confusion_0_0": 3, "confusion_1_0": 2, "asr": 0.1, "asr_samples": 4},
    }
    assert evaluation_in_the_clear(report, False) == {
        "num_samples": 10,
        "accuracy": 0.5,
        "loss": 0.7,
        "metrics": {"asr": 0.1, "asr_samples": 4},
    }
    assert evaluation_in_the_clear(report, True) == report
    bare = {**report, "metrics": {"confusion_0_0": 3}}
    assert "metrics" not in evaluation_in_the_clear(bare, False)
    assert FederationSpec(min_clients=3, secure_aggregation={}).secure_aggregation.report_confusion is False
