"""A client's answers to the stages of a secure round, from its task and its round secrets. No I/O:
the worker (worker/agent.py) sends what these return and keeps the secrets in its state directory.

The task of each stage (the coordinator's GET …/task) carries the client's number, t, and what the
stage needs: its neighbours' keys (shares), the envelopes addressed to it with their senders' keys
(masked upload and unmasking), and the survivors and dropped clients (unmasking).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np
from fedprompt.shared.secagg import protocol, quantise, shamir
from fedprompt.shared.secagg.protocol import PeerKeys, RoundSecrets


def context_of(federation_id: int, task: Mapping[str, Any]) -> bytes:
    """The round context of a task."""
    return protocol.round_context(federation_id, int(task["round"]), int(task["attempt"]))


def _peers(raw: Mapping[str, Any]) -> dict[int, PeerKeys]:
    return {int(j): PeerKeys.from_json(keys) for j, keys in raw.items()}


def keys_payload(own: RoundSecrets) -> dict[str, str]:
    """The keys stage: public keys and the commitment to the self-mask seed."""
    return own.advertisement()


def shares_payload(
    own: RoundSecrets,
    federation_id: int,
    task: Mapping[str, Any],
    *,
    randbelow: shamir.RandBelow = secrets.randbelow,
) -> dict[str, Any]:
    """The shares stage: an envelope for each neighbour the task names."""
    envelopes = protocol.share_keys(
        own,
        int(task["index"]),
        _peers(task["neighbours"]),
        int(task["t"]),
        context_of(federation_id, task),
        randbelow=randbelow,
    )
    return {"envelopes": {str(j): protocol.b64(e) for j, e in envelopes.items()}}


def masked_body(
    own: RoundSecrets,
    federation_id: int,
    task: Mapping[str, Any],
    update: np.ndarray,
    weight: int,
    metrics: Mapping[str, Any] | None = None,
) -> bytes:
    """The masked upload: the update (flattened, new − global prompt) clipped and quantised, times
    the weight, plus the self mask and a pairwise mask with each sender of an envelope to this client."""
    sa = task.get("secure_aggregation", task)
    clip, bits = float(sa["clip"]), int(sa["bits"])
    levels = quantise.weighted(quantise.quantise(update, clip, bits), weight)
    peers = _peers(sa["peers"])
    missing = set(sa["envelopes"]) - set(sa["peers"])
    if missing:
        raise protocol.ProtocolError(f"the task names no keys for senders {sorted(missing)}")
    context = protocol.round_context(federation_id, int(task["round"]), int(sa["attempt"]))
    vector = protocol.masked_vector(
        own, int(sa["index"]), levels, {int(j): peers[int(j)].mask_key for j in sa["envelopes"]}, context
    )
    metadata = {
        "round": str(task["round"]),
        "attempt": str(sa["attempt"]),
        "index": str(sa["index"]),
        "weight": str(weight),
        "metrics": dict(metrics or {}),
    }
    return protocol.encode_masked(vector, metadata)


def unmask_payload(own: RoundSecrets, federation_id: int, task: Mapping[str, Any]) -> dict[str, Any]:
    """The unmasking stage: per envelope's sender, the share of its seed (survivor) or of its mask key
    (dropped), never both."""
    envelopes = {int(j): protocol.unb64(e) for j, e in task["envelopes"].items()}
    reply = protocol.unmask_reply(
        own,
        int(task["index"]),
        envelopes,
        _peers(task["peers"]),
        [int(j) for j in task["survivors"]],
        [int(j) for j in task["dropped"]],
        int(task["t"]),
        context_of(federation_id, task),
    )
    return {"shares": {str(j): item for j, item in reply.items()}}
