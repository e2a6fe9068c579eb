"""Scripted secure-aggregation clients for tests: each answers its stages over the REST API with an
update the test chose (so the test knows every update), and can stop answering after a given stage
(a client killed there)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
from fedprompt.shared.secagg import client as stages
from fedprompt.shared.secagg.protocol import RoundSecrets

API = "/api/v1/federations"


class ScriptedClient:
    """One client: its token, its update (flattened) and weight, and where it stops (None: never)."""

    def __init__(
        self,
        api: Any,
        fid: int,
        client_id: int,
        token: str,
        update: np.ndarray,
        weight: int,
        *,
        stop_after: str | None = None,
        stop_round: int | None = None,
        seed: int = 0,
    ) -> None:
        self.api, self.fid, self.client_id = api, fid, client_id
        self.headers = {"Authorization": f"Bearer {token}"}
        self.update, self.weight = update, weight
        self.stop_after, self.stop_round = stop_after, stop_round
        self.secrets: dict[tuple[int, int], RoundSecrets] = {}
        self.randbelow = random.Random(seed).randrange
        self.done: list[tuple[int, str]] = []  # (round, stage) answered
        self.last_masked: bytes | None = None
        self.masked: dict[tuple[int, int], bytes] = {}  # (round, attempt) -> the masked upload
        self.holds: set[tuple[int, str]] = set()  # (round, stage) not answered for now

    @property
    def stopped(self) -> bool:
        return any(
            stage == self.stop_after and self.stop_round in (None, number) for number, stage in self.done
        )

    def step(self) -> str | None:
        """Answer the current task once; the stage answered, or None."""
        if self.stopped:
            return None
        resp = self.api.get(f"{API}/{self.fid}/task", headers=self.headers)
        if resp.status_code == 204:
            return None
        task = resp.json()
        stage_now = task.get("stage") or ("masked" if "secure_aggregation" in task else task["kind"])
        if (task["round"], stage_now) in self.holds:
            return None
        if task["kind"] == "secagg":
            stage = task["stage"]
            own = self.secrets.setdefault((task["round"], task["attempt"]), RoundSecrets.new())
            if stage == "keys":
                payload: dict[str, Any] = stages.keys_payload(own)
            elif stage == "shares":
                payload = stages.shares_payload(own, self.fid, task, randbelow=self.randbelow)
            else:
                payload = stages.unmask_payload(own, self.fid, task)
            answer = self.api.post(
                f"{API}/{self.fid}/rounds/{task['round']}/secagg/{stage}", json=payload, headers=self.headers
            )
            assert answer.status_code in (200, 201), answer.text
            self.done.append((task["round"], stage))
            return stage
        if task["kind"] == "train" and "secure_aggregation" in task:
            own = self.secrets[(task["round"], task["attempt"])]
            body = stages.masked_body(own, self.fid, task, self.update, self.weight, {"loss": 0.5})
            answer = self.api.put(
                f"{API}/{self.fid}/rounds/{task['round']}/update", content=body, headers=self.headers
            )
            assert answer.status_code in (200, 201), answer.text
            self.last_masked = self.masked[(task["round"], task["attempt"])] = body
            self.done.append((task["round"], "masked"))
            return "masked"
        if task["kind"] == "evaluate":
            self.api.post(
                f"{API}/{self.fid}/rounds/{task['version']}/evaluation",
                json={"num_samples": 10, "accuracy": 0.5},
                headers=self.headers,
            )
            return "evaluate"
        return None


def close_to_any(blob: bytes, vectors: list[np.ndarray]) -> bool:
    """Whether the blob, read as float32, float64 or uint64 from any byte offset, holds a run of values
    within 1e-3 of one of the vectors."""
    for dtype in (np.float32, np.float64, np.uint64):
        size = np.dtype(dtype).itemsize
        for offset in range(size):
            usable = (len(blob) - offset) // size * size
            with np.errstate(invalid="ignore", over="ignore"):
                values = np.frombuffer(blob[offset : offset + usable], dtype=dtype).astype(np.float64)
            for v in vectors:
                if len(values) < len(v):
                    continue
                with np.errstate(invalid="ignore"):
                    starts = np.nonzero(np.abs(values[: len(values) - len(v) + 1] - v[0]) <= 1e-3)[0]
                    if any(np.abs(values[i : i + len(v)] - v).max() <= 1e-3 for i in starts):
                        return True
    return False
