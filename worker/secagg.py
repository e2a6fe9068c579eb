"""A worker's side of secure aggregation: its signing key, round secrets, round records and masked
vectors, kept in the state directory (0600) before anything derived from them is sent, so that a
restarted worker answers with the secrets it shared, re-sends the masked vector it made rather than
making another, and cannot be asked a second, different question about a round attempt it answered.

    <state dir>/secagg/signing.key                    this client's Ed25519 signing key (raw, base64)
    <state dir>/secagg/pins.json                      client id -> the signing key seen for it
    <state dir>/secagg/<round>-revealed.json          neighbour's mask key -> the kind of share revealed
    <state dir>/secagg/<round>-<attempt>.json         the round's X25519 private keys and self-mask seed
    <state dir>/secagg/<round>-<attempt>.record.json  what the round told it and what it answered
    <state dir>/secagg/<round>-<attempt>.masked       the masked upload, once made

The rules themselves are pure (shared/secagg/client.py); here they are fed the kept record and their
new record is kept before the answer leaves. Files of earlier rounds are removed when a later round's
stage comes (a round's revealed kinds span its attempts; keys of earlier rounds never recur).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from fedprompt.shared.secagg import client as stages
from fedprompt.shared.secagg import shamir, signing
from fedprompt.shared.secagg.protocol import RoundSecrets, b64, unb64
from fedprompt.worker.state import _atomic_write


def evaluation_in_the_clear(report: Mapping[str, Any], report_confusion: bool) -> dict[str, Any]:
    """An evaluation report as it may leave a client of a secure federation: without its confusion
    counts (its label mix, per class) unless the spec's secure_aggregation.report_confusion allows them."""
    out = dict(report)
    if not report_confusion and "metrics" in out:
        metrics = {k: v for k, v in out["metrics"].items() if not k.startswith("confusion_")}
        if metrics:
            out["metrics"] = metrics
        else:
            del out["metrics"]
    return out


class SecureStages:
    """One client's secure-aggregation stages for one federation."""

    def __init__(
        self,
        root: Path,
        federation_id: int,
        client_id: int,
        policy: stages.Policy,
        *,
        randbelow: shamir.RandBelow = secrets.randbelow,
    ) -> None:
        self.dir = root / "secagg"
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.federation_id = federation_id
        self.client_id = client_id
        self.policy = policy
        self.randbelow = randbelow  # Shamir's coefficients: the OS CSPRNG unless a test passes a seeded one

    def _path(self, number: int, attempt: int, suffix: str) -> Path:
        return self.dir / f"{number}-{attempt}.{suffix}"

    def _read(self, path: Path, default: Any) -> Any:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return default

    def _keep(self, path: Path, value: Any) -> None:
        _atomic_write(path, json.dumps(value, sort_keys=True).encode())

    def signing_key(self) -> bytes:
        """This client's signing key: read back if kept, else made (OS CSPRNG) and kept first."""
        path = self.dir / "signing.key"
        try:
            return unb64(path.read_text().strip(), 32)
        except FileNotFoundError:
            pass
        made = signing.new_signing_key()
        _atomic_write(path, b64(made).encode())
        return made

    def secrets_for(self, number: int, attempt: int) -> RoundSecrets:
        """This round attempt's secrets: read back if kept, else made (OS CSPRNG) and kept first."""
        self._forget_before(number)
        path = self._path(number, attempt, "json")
        try:
            return RoundSecrets.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            pass
        made = RoundSecrets.new()
        _atomic_write(path, json.dumps(made.to_json()).encode())
        return made

    def answer(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The payload of a keys, shares, consistency or unmasking task (ProtocolError when the task
        breaks a rule this client enforces: it then answers nothing)."""
        number, attempt = int(task["round"]), int(task["attempt"])
        own = self.secrets_for(number, attempt)
        record_path = self._path(number, attempt, "record.json")
        record = self._read(record_path, {})
        stage = task["stage"]
        fid = self.federation_id
        if stage == "keys":
            payload, made = stages.keys_payload(own, self.signing_key(), fid, task, self.client_id, record)
            record = {**record, **made}
        elif stage == "shares":
            pins_path = self.dir / "pins.json"
            payload, record, pins = stages.shares_payload(
                own,
                self.signing_key(),
                self.client_id,
                self.policy,
                fid,
                task,
                record,
                self._read(pins_path, {}),
                randbelow=self.randbelow,
            )
            self._keep(pins_path, pins)
        elif stage == "consistency":
            payload, record = stages.consistency_payload(self.signing_key(), self.policy, fid, task, record)
        elif stage == "unmask":
            revealed_path = self.dir / f"{number}-revealed.json"
            payload, record, revealed = stages.unmask_payload(
                own, fid, task, record, self._read(revealed_path, {})
            )
            self._keep(revealed_path, revealed)
        else:
            raise ValueError(f"no secure aggregation stage {stage!r}")
        self._keep(record_path, record)
        return payload

    def check_masked(self, task: Mapping[str, Any]) -> None:
        """Whether this client will make a masked vector for a train task (ProtocolError if not),
        before it spends the training on it."""
        number, attempt = int(task["round"]), int(task["secure_aggregation"]["attempt"])
        if self._path(number, attempt, "masked").exists():
            return
        record = self._read(self._path(number, attempt, "record.json"), {})
        stages.check_masked(self.secrets_for(number, attempt), self.federation_id, task, record)

    def masked(
        self, task: Mapping[str, Any], update: np.ndarray, weight: int, metrics: Mapping[str, Any]
    ) -> bytes:
        """The masked upload of a train task: the one made before for this round attempt, if any (a
        worker never sends two different masked vectors for one round), else made and kept first."""
        number, attempt = int(task["round"]), int(task["secure_aggregation"]["attempt"])
        path = self._path(number, attempt, "masked")
        if path.exists():
            return path.read_bytes()
        own = self.secrets_for(number, attempt)
        record_path = self._path(number, attempt, "record.json")
        body, record = stages.masked_body(
            own, self.policy, self.federation_id, task, self._read(record_path, {}), update, weight, metrics
        )
        self._keep(record_path, record)
        _atomic_write(path, body)
        return body

    def _forget_before(self, number: int) -> None:
        for path in self.dir.iterdir():
            head = path.name.split("-", 1)[0]
            if head.isdigit() and int(head) < number:
                path.unlink(missing_ok=True)
