"""Scripted secure-aggregation clients for tests: each answers its stages over the REST API with an
update the test chose (so the test knows every update), through the worker's own secure stages
(worker/secagg.py: the rules an honest client enforces, its state kept in a folder), and can stop
answering after a given stage (a client killed there)."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from fedprompt.shared.contract import Task
from fedprompt.shared.secagg.client import Policy
from fedprompt.shared.spec import FederationSpec
from fedprompt.worker.secagg import SecureStages

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
        state_dir: Path | None = None,
    ) -> None:
        self.api, self.fid, self.client_id = api, fid, client_id
        self.headers = {"Authorization": f"Bearer {token}"}
        self.update, self.weight = update, weight
        self.stop_after, self.stop_round = stop_after, stop_round
        self.state_dir = state_dir or Path(tempfile.mkdtemp(prefix=f"secagg-client-{client_id}-"))
        self.randbelow = random.Random(seed).randrange
        self._stages: SecureStages | None = None
        self.done: list[tuple[int, str]] = []  # (round, stage) answered
        self.refused: list[str] = []  # what this client refused to answer, and why
        self.last_masked: bytes | None = None
        self.masked: dict[tuple[int, int], bytes] = {}  # (round, attempt) -> the masked upload
        self.holds: set[tuple[int, str]] = set()  # (round, stage) not answered for now

    @property
    def stages(self) -> SecureStages:
        """The worker's secure stages for this client, with the policy of its own copy of the spec."""
        if self._stages is None:
            spec = FederationSpec.model_validate(
                self.api.get(f"{API}/{self.fid}/spec", headers=self.headers).json()
            )
            self._stages = SecureStages(
                self.state_dir, self.fid, self.client_id, Policy.from_spec(spec), randbelow=self.randbelow
            )
        return self._stages

    @property
    def stopped(self) -> bool:
        return any(
            stage == self.stop_after and self.stop_round in (None, number) for number, stage in self.done
        )

    def task(self) -> dict[str, Any] | None:
        """The coordinator's current task for this client, or None."""
        resp = self.api.get(f"{API}/{self.fid}/task", headers=self.headers)
        if resp.status_code == 204:
            return None
        Task.model_validate(resp.json())  # every stage's task fits the contract a worker reads it with
        return resp.json()  # as sent: a test may alter it before answering

    def step(self) -> str | None:
        """Answer the current task once; the stage answered, or None."""
        if self.stopped:
            return None
        task = self.task()
        if task is None:
            return None
        stage_now = task.get("stage") or ("masked" if "secure_aggregation" in task else task["kind"])
        if (task["round"], stage_now) in self.holds:
            return None
        return self.answer(task)

    def answer(self, task: dict[str, Any]) -> str | None:
        """Answer a task (as given, or as a test altered it); None when this client refuses it."""
        if task["kind"] == "secagg":
            stage = task["stage"]
            try:
                payload = self.stages.answer(task)
            except ValueError as exc:  # ProtocolError, EnvelopeError, ShamirError
                self.refused.append(f"{stage}: {exc}")
                return None
            answer = self.api.post(
                f"{API}/{self.fid}/rounds/{task['round']}/secagg/{stage}", json=payload, headers=self.headers
            )
            assert answer.status_code in (200, 201), answer.text
            self.done.append((task["round"], stage))
            return stage
        if task["kind"] == "train" and "secure_aggregation" in task:
            try:
                body = self.stages.masked(task, self.update, self.weight, {"loss": 0.5})
            except ValueError as exc:  # ProtocolError, EnvelopeError, ShamirError
                self.refused.append(f"masked: {exc}")
                return None
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
