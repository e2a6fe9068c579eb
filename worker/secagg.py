"""A worker's side of secure aggregation: its round secrets and masked vectors, kept in the state
directory (0600) so that a restarted worker answers the unmasking stage with the secrets it shared and
re-sends the masked vector it made rather than making another.

    <state dir>/secagg/<round>-<attempt>.json         the round's X25519 private keys and self-mask seed
    <state dir>/secagg/<round>-<attempt>.masked       the masked upload, once made

Files of earlier rounds are removed when a later round's stage comes.
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
from fedprompt.shared.secagg import shamir
from fedprompt.shared.secagg.protocol import RoundSecrets
from fedprompt.worker.state import _atomic_write


class SecureStages:
    """One client's secure-aggregation stages for one federation."""

    def __init__(
        self, root: Path, federation_id: int, *, randbelow: shamir.RandBelow = secrets.randbelow
    ) -> None:
        self.dir = root / "secagg"
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.federation_id = federation_id
        self.randbelow = randbelow  # Shamir's coefficients: the OS CSPRNG unless a test passes a seeded one

    def _path(self, number: int, attempt: int, suffix: str) -> Path:
        return self.dir / f"{number}-{attempt}.{suffix}"

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
        """The payload of a keys, shares or unmasking task."""
        own = self.secrets_for(int(task["round"]), int(task["attempt"]))
        stage = task["stage"]
        if stage == "keys":
            return stages.keys_payload(own)
        if stage == "shares":
            return stages.shares_payload(own, self.federation_id, task, randbelow=self.randbelow)
        if stage == "unmask":
            return stages.unmask_payload(own, self.federation_id, task)
        raise ValueError(f"no secure aggregation stage {stage!r}")

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
        body = stages.masked_body(own, self.federation_id, task, update, weight, metrics)
        _atomic_write(path, body)
        return body

    def _forget_before(self, number: int) -> None:
        for path in self.dir.iterdir():
            head = path.name.split("-", 1)[0]
            if head.isdigit() and int(head) < number:
                path.unlink(missing_ok=True)
