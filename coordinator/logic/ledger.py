"""Communication ledger: what crossed the network per round and per federation, against full fine-tuning.

Pure: takes the spec's parameter counts and the closed rounds' stats (participants, updates, bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def comm_ratio(params_communicated: int, params_full_model: int | None) -> float | None:
    """Parameters sent per client and direction as a fraction of the whole model (None: size unknown)."""
    if not params_full_model:
        return None
    return params_communicated / params_full_model


def round_entry(number: int, stats: Mapping[str, Any], params_per_client: int) -> dict[str, Any]:
    """One round: bytes and parameters up (uploads) and down (participants' downloads)."""
    uploads = int(stats.get("updates", 0))
    participants = int(stats.get("participants", 0))
    return {
        "round": number,
        "participants": participants,
        "uploads": uploads,
        "bytes_up": int(stats.get("bytes_up", 0)),
        "bytes_down": int(stats.get("bytes_down", 0)),
        "params_up": uploads * params_per_client,
        "params_down": participants * params_per_client,
    }


def ledger(
    rounds: Iterable[tuple[int, Mapping[str, Any]]],
    *,
    params_per_client: int,
    params_full_model: int | None,
    per_client: Mapping[int, Mapping[str, int]] | None = None,
) -> dict[str, Any]:
    """Per-round and per-client entries, federation totals and the ratio to full fine-tuning of the model.

    ``per_client`` maps a client id to its uploads, bytes_up, downloads and bytes_down (all rounds).
    """
    entries = [round_entry(n, stats, params_per_client) for n, stats in rounds]
    totals = {
        key: sum(e[key] for e in entries) for key in ("bytes_up", "bytes_down", "params_up", "params_down")
    }
    return {
        "params_communicated": params_per_client,
        "params_full_model": params_full_model,
        "comm_ratio": comm_ratio(params_per_client, params_full_model),
        # Full fine-tuning would move the whole model the same number of times.
        "full_model_params_moved": (
            (totals["params_up"] + totals["params_down"]) // params_per_client * params_full_model
            if params_full_model and params_per_client
            else None
        ),
        "rounds": entries,
        "clients": {
            str(cid): {
                **dict(row),
                "params_up": int(row.get("uploads", 0)) * params_per_client,
                "params_down": int(row.get("downloads", 0)) * params_per_client,
            }
            for cid, row in sorted((per_client or {}).items())
        },
        "totals": totals,
    }
