"""What a closed round records (its `stats`) and the LDP record of a federation. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedprompt.shared.privacy import gaussian_noise_multiplier, spent_epsilon
from fedprompt.shared.spec_options import PrivacySpec


def round_stats(
    updates: Sequence[Any],
    downloads: Sequence[int],
    *,
    notes: Mapping[int, str],
    declared: Mapping[int, int] | None = None,
    aggregation_s: float,
    server_optimizer: dict[str, Any] | None = None,
    privacy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A round's statistics from its aggregated updates (each with client_id, num_samples, size and
    metrics) and its participants' downloaded bytes.

    `notes` are the aggregation rule's, by position in `updates`; `declared` maps a client to the
    num_samples its update declared, and an update stored with fewer (clipped to the client's
    enrolled figure) is noted too. train_loss is the updates' loss weighted by their samples."""
    samples = sum(u.num_samples for u in updates)
    losses = [(u.metrics.get("loss"), u.num_samples) for u in updates if u.metrics.get("loss") is not None]
    by_client = {str(updates[i].client_id): note for i, note in notes.items()}
    for u in updates:
        claimed = (declared or {}).get(u.client_id)
        if claimed is not None and claimed > u.num_samples:
            clipped = f"num_samples {claimed} clipped to {u.num_samples}, the figure the client enrolled with"
            key = str(u.client_id)
            by_client[key] = f"{by_client[key]}; {clipped}" if key in by_client else clipped
    stats: dict[str, Any] = {
        "participants": len(downloads),
        "updates": len(updates),
        "num_samples": samples,
        "bytes_up": sum(u.size for u in updates),
        "bytes_down": sum(downloads),
        "train_loss": (sum(float(v) * w for v, w in losses) / sum(w for _, w in losses)) if losses else None,
        "notes": by_client,
        "aggregation_s": aggregation_s,  # decode, aggregate, encode
    }
    steps = [u.metrics["steps"] for u in updates if isinstance(u.metrics.get("steps"), int | float)]
    if steps:  # local steps the aggregated updates trained (fewer than local_steps under local_epochs)
        stats["local_steps"] = int(sum(steps))
    for key in ("local_asr", "local_accuracy"):  # what malicious clients report of their own prompt
        reported = {str(u.client_id): u.metrics[key] for u in updates if key in u.metrics}
        if reported:
            stats[key] = reported
    if server_optimizer is not None:
        stats["server_optimizer"] = server_optimizer
    if privacy is not None:
        stats["privacy"] = privacy
    return stats


def privacy_record(
    privacy: PrivacySpec, uploads: Mapping[int, int], client_ids: Sequence[int] | None = None
) -> dict[str, Any]:
    """The LDP record shown in the status and each round's stats: the mechanism's settings (with the
    Gaussian noise multiplier), each client's cumulative epsilon (only `client_ids` when given) and
    the largest. `uploads` is each client's number of updates sent: whatever an update claims, its
    epsilon is the federation's mechanism composed over that many releases (privacy.spent_epsilon)."""
    spent = {
        cid: spent_epsilon(privacy.mechanism, privacy.epsilon, privacy.delta, n) for cid, n in uploads.items()
    }
    shown = sorted(spent) if client_ids is None else client_ids
    record: dict[str, Any] = privacy.model_dump()
    if privacy.mechanism == "gaussian":
        assert privacy.delta is not None
        record["noise_multiplier"] = gaussian_noise_multiplier(privacy.epsilon, privacy.delta)
    return record | {
        "cumulative_epsilon": {str(cid): spent.get(cid, 0.0) for cid in shown},
        "max_cumulative_epsilon": max(spent.values(), default=0.0),
    }
