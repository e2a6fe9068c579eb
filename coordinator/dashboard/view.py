"""The dashboard's view model: pure functions from the service's answers to what the page shows.

Communication figures are the federation status's ledger (coordinator/logic/ledger.py), the same
the API answers and simulate records."""

from __future__ import annotations

import math
from typing import Any

from fedprompt.coordinator.logic.round_states import STAGES
from fedprompt.coordinator.logic.sites import count_states
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import FederationState, Method, RoundState, SecureStage
from pydantic import ValidationError

FLOAT32_BYTES = 4


def federation_row(status: dict[str, Any]) -> dict[str, Any]:
    """One line of the federation list."""
    latest = (status.get("latest") or {}).get("evaluation") or {}
    return {
        "id": status["id"],
        "name": status["name"],
        "state": status["state"],
        "paused": bool(status["paused"]),
        "round": status["current_round"],
        "rounds_total": status["rounds_total"],
        "clients_available": status["clients"]["available"],
        "clients_enrolled": status["clients"]["enrolled"],
        "accuracy": latest.get("accuracy"),
    }


def pick_federation(statuses: list[dict[str, Any]], wanted: int | None) -> int | None:
    """The federation to show: the one asked for if it exists, else the newest running one, else the newest."""
    ids = [s["id"] for s in statuses]
    if wanted in ids:
        return wanted
    running = [s["id"] for s in statuses if s["state"] == FederationState.RUNNING]
    return (running or ids or [None])[-1]


def client_status(client: dict[str, Any]) -> str:
    """The site's state as the API reports it (coordinator/logic/sites.py): live, training, stale,
    gone or revoked."""
    return str(client.get("state") or ("revoked" if client["revoked"] else "live"))


def client_doing(client: dict[str, Any]) -> str:
    """What its last heartbeat said, for the badge's tooltip."""
    said = client.get("activity") or {}
    if said.get("phase") == "training":
        return f"training round {said.get('round')}: step {said.get('step')} of {said.get('total_steps')}"
    return f"{said['phase']} after round {said.get('round')}" if said.get("phase") else "no heartbeat yet"


def timeline(
    rounds: list[dict[str, Any]], quorum: int, now: float, names: dict[int, str] | None = None
) -> list[dict[str, Any]]:
    """Every round attempt, newest first, with duration, uploads vs quorum and bar width."""
    rows = []
    for r in rounds:
        end = r["closed_at"] if r["closed_at"] is not None else now
        seconds = max(end - r["opened_at"], 0.0)
        uploaded = sum(1 for p in r["participants"] if p["uploaded"])
        ev = r.get("evaluation") or {}
        rows.append(
            {
                "round": r["round"],
                "attempt": r["attempt"],
                "state": r["state"],
                "opened_at": r["opened_at"],
                "closed_at": r["closed_at"],
                "seconds": seconds,
                "running": r["closed_at"] is None,
                "participants": len(r["participants"]),
                "uploaded": uploaded,
                "quorum": quorum,
                "closed_by": r.get("closed_by"),
                "failure_reason": r.get("failure_reason"),
                "bytes_up": (r.get("stats") or {}).get("bytes_up"),
                "bytes_down": (r.get("stats") or {}).get("bytes_down"),
                "accuracy": ev.get("accuracy"),
                "macro_f1": ev.get("macro_f1"),
                "collapsed": bool(ev.get("collapsed")),
                "per_class_accuracy": ev.get("per_class_accuracy") or [],
                "notes": (r.get("stats") or {}).get("notes") or {},
                "secure": secure_summary(r, names),
            }
        )
    longest = max((row["seconds"] for row in rows), default=0.0)
    for row in rows:
        row["bar_pct"] = round(100.0 * row["seconds"] / longest, 1) if longest > 0 else 0.0
    rows.reverse()
    return rows


def secure_summary(r: dict[str, Any], names: dict[int, str] | None = None) -> dict[str, Any] | None:
    """A secure round's timeline: its running stage and that stage's deadline, how many clients
    answered each stage so far, and who dropped at which stage, by name."""
    live = r.get("secure_aggregation") or (r.get("stats") or {}).get("secure_aggregation")
    if not live:
        return None
    names = names or {}
    completed = live.get("completed") or {}
    running = live.get("stage") if r.get("closed_at") is None else None
    return {
        "stage": running,
        "deadline_at": live.get("stage_deadline_at") if running else None,
        "stages": [(stage, len(completed[stage])) for stage in STAGES if stage in completed],
        "survivors": len(completed[SecureStage.MASKED] or []) if SecureStage.MASKED in completed else None,
        "dropped": [
            (names.get(int(cid), f"client {cid}"), stage)
            for cid, stage in sorted((live.get("dropped_at") or {}).items(), key=lambda item: int(item[0]))
        ],
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def series(
    rounds: list[dict[str, Any]], initial: dict[str, Any] | None
) -> dict[str, list[float | None] | list[int]]:
    """Per-version metric series for the charts: x is the prompt version (0 = initial prompt)."""
    evals: dict[int, dict[str, Any]] = {}
    if initial:
        evals[0] = initial
    stats: dict[int, dict[str, Any]] = {}
    for r in rounds:
        if r["state"] == RoundState.CLOSED and r.get("result_version") is not None:
            if r.get("evaluation"):
                evals[r["result_version"]] = r["evaluation"]
            stats[r["result_version"]] = r.get("stats") or {}
    versions = sorted({*evals, *stats})
    return {
        "version": versions,
        "accuracy": [_num((evals.get(v) or {}).get("accuracy")) for v in versions],
        "loss": [_num((evals.get(v) or {}).get("loss")) for v in versions],
        "asr": [_num((evals.get(v) or {}).get("asr")) for v in versions],
        "train_loss": [_num((stats.get(v) or {}).get("train_loss")) for v in versions],
        "bytes_up": [_num((stats.get(v) or {}).get("bytes_up")) for v in versions],
        "bytes_down": [_num((stats.get(v) or {}).get("bytes_down")) for v in versions],
    }


def prompt_shape(spec: dict[str, Any]) -> str:
    """The communicated tensors in words: '20 × 384' for one tensor, else how many (an encoder)."""
    try:
        shapes = list(FederationSpec.model_validate(spec).tensor_shapes().values())
    except ValidationError:
        return ""
    if len(shapes) == 1:
        return " × ".join(str(n) for n in shapes[0])
    return f"{len(shapes)} tensors"


def communication(status: dict[str, Any]) -> dict[str, Any]:
    """What the prompt costs on the wire, from the federation's ledger (coordinator/logic/ledger.py):
    the method's communicated parameters, bytes moved over the closed rounds, and the ratio to full
    fine-tuning when the model's size is known: from the spec (params_full_model), else as the first
    worker to state it enrolled with."""
    spec = status.get("spec") or {}
    led = status.get("ledger") or {}
    params = int(led.get("params_communicated") or 0)
    totals = led.get("totals") or {}
    updates = sum(int(r.get("uploads") or 0) for r in led.get("rounds") or [])
    up = int(totals.get("bytes_up") or 0)
    ratio = led.get("comm_ratio")
    return {
        "method": spec.get("method", Method.PROMPT_TUNING),
        "prompt_shape": prompt_shape(spec),
        "prompt_parameters": params,
        "prompt_bytes": params * FLOAT32_BYTES,
        "bytes_up": up,
        "bytes_down": int(totals.get("bytes_down") or 0),
        "bytes_per_update": up / updates if updates else None,
        "closed_rounds": len(led.get("rounds") or []),
        "model_parameters": led.get("params_full_model") if ratio is not None else None,
        "model_parameters_from": "spec" if spec.get("params_full_model") else "enrolment",
        "ratio": ratio,
    }


def federation_detail(
    status: dict[str, Any],
    rounds: list[dict[str, Any]],
    clients: list[dict[str, Any]],
    initial_evaluation: dict[str, Any] | None,
    refused: dict[int, int],
    now: float,
) -> dict[str, Any]:
    """Everything the page shows about one federation."""
    spec = status.get("spec") or {}
    names = {c["id"]: c["name"] for c in clients}
    missed: dict[int, int] = {}
    for r in rounds:
        if r["state"] in (RoundState.CLOSED, RoundState.FAILED):
            for p in r["participants"]:
                if not p["uploaded"]:
                    missed[p["client_id"]] = missed.get(p["client_id"], 0) + 1
    charts = series(rounds, initial_evaluation)
    open_round = status.get("open_round")
    participants = []
    if open_round:
        participants = [
            {"client_id": p["client_id"], "name": names.get(p["client_id"], "?"), "uploaded": p["uploaded"]}
            for p in open_round["participants"]
        ]
    return {
        "id": status["id"],
        "name": status["name"],
        "state": status["state"],
        "paused": bool(status["paused"]),
        "completed": status["state"] == FederationState.COMPLETED,
        "current_round": status["current_round"],
        "rounds_total": status["rounds_total"],
        "latest_version": status["latest_version"],
        "best_version": status.get("best_version"),
        "buffer": buffer_view(status.get("buffer"), names),
        "clients_summary": status["clients"],
        "quorum": int(spec.get("quorum", 1)),
        "fraction": spec.get("fraction"),
        "model": spec.get("model"),
        "aggregation": (spec.get("aggregation") or {}).get("name"),
        "open_round": open_round,
        "deadline_at": open_round["deadline_at"] if open_round else None,
        "participants": participants,
        "uploaded": sum(1 for p in participants if p["uploaded"]),
        "timeline": timeline(rounds, int(spec.get("quorum", 1)), now, names),
        "failures": sum(1 for r in rounds if r["state"] == RoundState.FAILED),
        "retries": sum(1 for r in rounds if r["attempt"] > 1),
        "series": charts,
        "communication": communication(status),
        "clients": [
            {
                **c,
                "status": client_status(c),
                "doing": client_doing(c),
                "missed": missed.get(c["id"], 0),
                "refused": refused.get(c["id"], 0),
            }
            for c in clients
        ],
        "has_asr": any(v is not None for v in charts["asr"]),
        "site_summary": site_summary(clients),
    }


def buffer_view(buffer: dict[str, Any] | None, names: dict[int, str]) -> dict[str, Any] | None:
    """Mode async's block: the open buffer's fill, who trains, the staleness line and the clients'
    throughput (None for a federation of rounds)."""
    if buffer is None:
        return None
    return {
        **buffer,
        "training_names": [names.get(cid, f"#{cid}") for cid in buffer["training"]],
        "staleness_line": " · ".join(f"τ={tau}: {n}" for tau, n in buffer["staleness"].items()) or "none yet",
    }


def site_summary(clients: list[dict[str, Any]]) -> str:
    """'2 live · 1 training · 1 stale': live and training always, the other states where any."""
    counts = count_states([client_status(c) for c in clients])
    return " · ".join(f"{n} {state}" for state, n in counts.items() if n or state in ("live", "training"))
