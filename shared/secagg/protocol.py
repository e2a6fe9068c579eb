"""One round of secure aggregation: a client's four stages and the coordinator's unmasking.

Participants are numbered 1..n in the order of their client ids; `context` binds every derived key
and envelope to one federation, round and attempt (``round_context``).

1. advertise: a client makes two X25519 key pairs (one to encrypt its shares, one for its pairwise
   masks) and a self-mask seed b, keeps them (``RoundSecrets``) and sends the public keys with a
   sha256 commitment to b.
2. share keys: it splits b and its mask private key with Shamir's scheme (threshold t) among its
   neighbours and seals each neighbour's two shares in an AES-GCM envelope (``share_keys``).
3. masked upload: it quantises its update, multiplies it by its weight and adds its self mask and a
   pairwise mask with every neighbour whose envelope it received (``masked_vector``).
4. unmasking: given the survivors (masked vector received) and the dropped (shared, then no masked
   vector), it opens its envelopes and reveals, per sender, the share of b for a survivor or the share
   of the mask key for a dropped client, never both (``unmask_reply``).

The coordinator adds the masked vectors in Z_2^64 and removes the masks (``unmasked_sum``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fedprompt.shared.secagg import graph, masks, shamir, shares
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

MASKED_FORMAT = "fedprompt-secagg/1"
MASKED_TENSOR = "masked"


class ProtocolError(ValueError):
    """A stage that cannot be carried out as asked (the message says why)."""


def round_context(federation_id: int, number: int, attempt: int) -> bytes:
    """The bytes that bind keys, masks and envelopes to one attempt of one round."""
    return f"federation={federation_id};round={number};attempt={attempt}".encode()


def threshold(k: int, fraction: float) -> int:
    """t: the shares of a client's secrets that reconstruct them, ⌊fraction·k⌋ + 1, at least 2 and at
    most k (graph.threshold)."""
    return graph.threshold(k, fraction)


def b64(data: bytes) -> str:
    """Standard base64 text."""
    return base64.b64encode(data).decode()


def unb64(text: str, length: int | None = None) -> bytes:
    """Bytes from base64 text, checked for length when given."""
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise ProtocolError("a value is not base64") from None
    if length is not None and len(data) != length:
        raise ProtocolError(f"a value is {len(data)} bytes; expected {length}")
    return data


@dataclass(frozen=True)
class RoundSecrets:
    """What a client keeps for one round until it has answered the unmasking stage."""

    encryption_private: bytes
    mask_private: bytes
    self_seed: bytes

    @classmethod
    def new(cls) -> RoundSecrets:
        """Fresh keys and seed from the OS CSPRNG."""
        return cls(
            masks.private_bytes(masks.new_private_key()),
            masks.private_bytes(masks.new_private_key()),
            masks.new_seed(),
        )

    def to_json(self) -> dict[str, str]:
        """Base64 fields, for the state directory."""
        return {k: b64(getattr(self, k)) for k in ("encryption_private", "mask_private", "self_seed")}

    @classmethod
    def from_json(cls, data: Mapping[str, str]) -> RoundSecrets:
        """The inverse of to_json."""
        return cls(*(unb64(data[k], 32) for k in ("encryption_private", "mask_private", "self_seed")))

    def advertisement(self) -> dict[str, str]:
        """The public keys and the commitment to the self-mask seed."""
        return {
            "encryption_key": b64(_public(self.encryption_private)),
            "mask_key": b64(_public(self.mask_private)),
            "seed_commitment": hashlib.sha256(self.self_seed).hexdigest(),
        }


def _public(private: bytes) -> bytes:
    return masks.public_bytes(masks.private_from_bytes(private))


@dataclass(frozen=True)
class PeerKeys:
    """A neighbour's advertised keys."""

    encryption_key: bytes
    mask_key: bytes
    seed_commitment: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PeerKeys:
        """Parsed and length-checked."""
        commitment = str(data.get("seed_commitment", ""))
        if len(commitment) != 64 or any(c not in "0123456789abcdef" for c in commitment):
            raise ProtocolError("seed_commitment must be a hex sha256")
        return cls(
            unb64(str(data.get("encryption_key", "")), 32),
            unb64(str(data.get("mask_key", "")), 32),
            commitment,
        )


def share_keys(
    own_secrets: RoundSecrets,
    own: int,
    neighbours: Mapping[int, PeerKeys],
    t: int,
    context: bytes,
    *,
    randbelow: shamir.RandBelow = secrets.randbelow,
) -> dict[int, bytes]:
    """Envelopes, one per neighbour, each with its shares of the self-mask seed and the mask key."""
    xs = sorted(neighbours)
    if own in neighbours:
        raise ProtocolError("a client is not its own neighbour")
    if len(xs) < t:
        raise ProtocolError(f"{len(xs)} neighbour(s) cannot hold shares of threshold {t}")
    seed_shares = shamir.split(own_secrets.self_seed, t, xs, randbelow=randbelow)
    key_shares = shamir.split(own_secrets.mask_private, t, xs, randbelow=randbelow)
    return {
        j: shares.seal(
            own_secrets.encryption_private,
            neighbours[j].encryption_key,
            context,
            own,
            j,
            seed_shares[j],
            key_shares[j],
        )
        for j in xs
    }


def masked_vector(
    own_secrets: RoundSecrets,
    own: int,
    weighted_levels: np.ndarray,
    peers_mask_keys: Mapping[int, bytes],
    context: bytes,
) -> np.ndarray:
    """The uploaded vector: weighted levels + self mask + a pairwise mask with each given peer."""
    pair_seeds = {
        j: masks.pairwise_seed(own_secrets.mask_private, key, context) for j, key in peers_mask_keys.items()
    }
    return masks.mask(weighted_levels, own, own_secrets.self_seed, pair_seeds)


def unmask_reply(
    own_secrets: RoundSecrets,
    own: int,
    envelopes: Mapping[int, bytes],
    senders: Mapping[int, PeerKeys],
    survivors: Sequence[int],
    dropped: Sequence[int],
    t: int,
    context: bytes,
) -> dict[int, dict[str, str]]:
    """Per sender of an envelope: {"kind": "seed" | "key", "share": base64}. Refused when a client is
    named both survivor and dropped, or when fewer than t survivors remain."""
    alive, gone = set(survivors), set(dropped)
    if alive & gone:
        raise ProtocolError(f"clients {sorted(alive & gone)} are named both survivors and dropped")
    if own not in alive:
        raise ProtocolError("this client is not among the survivors")
    if len(alive) < t:
        raise ProtocolError(f"{len(alive)} survivor(s) is below the threshold {t}")
    out: dict[int, dict[str, str]] = {}
    for sender, envelope in envelopes.items():
        if sender not in alive and sender not in gone:
            continue
        seed_share, key_share = shares.open_envelope(
            own_secrets.encryption_private, senders[sender].encryption_key, context, sender, own, envelope
        )
        kind, value = ("seed", seed_share) if sender in alive else ("key", key_share)
        out[sender] = {"kind": kind, "share": b64(shamir.share_to_bytes(value))}
    return out


def unmasked_sum(
    masked_total: np.ndarray,
    survivors: Sequence[int],
    dropped_included_by: Mapping[int, Sequence[int]],
    revealed: Mapping[int, Mapping[int, int]],
    keys: Mapping[int, PeerKeys],
    t: int,
    context: bytes,
) -> np.ndarray:
    """The sum of the survivors' weighted levels. `dropped_included_by` maps each dropped client to
    the survivors that masked with it; `revealed[j]` holds the shares {holder: value} of j's seed (a
    survivor) or mask key (dropped). Reconstructions are checked against the advertised commitment
    and public key."""
    self_seeds: list[bytes] = []
    for j in survivors:
        seed = shamir.reconstruct(dict(revealed.get(j, {})), t)
        if hashlib.sha256(seed).hexdigest() != keys[j].seed_commitment:
            raise ProtocolError(f"the shares of client {j}'s seed do not match its commitment")
        self_seeds.append(seed)
    pairs: list[tuple[int, int, bytes]] = []
    for j, included_by in dropped_included_by.items():
        private = shamir.reconstruct(dict(revealed.get(j, {})), t)
        if _public(private) != keys[j].mask_key:
            raise ProtocolError(f"the shares of client {j}'s mask key do not match its public key")
        for i in included_by:
            pairs.append((i, j, masks.pairwise_seed(private, keys[i].mask_key, context)))
    return masks.unmask(masked_total, self_seeds, pairs)


def flatten(tensors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]) -> np.ndarray:
    """The tensors as one float64 vector, in the spec's order."""
    return np.concatenate([np.asarray(tensors[name], dtype=np.float64).ravel() for name in shapes])


def unflatten(vector: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The inverse of flatten, as float32 tensors."""
    out, start = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape)
        out[name] = np.asarray(vector[start : start + size], dtype=np.float32).reshape(shape)
        start += size
    if start != len(vector):
        raise ProtocolError(f"a vector of {len(vector)} values does not fill shapes of {start}")
    return out


def encode_masked(vector: np.ndarray, metadata: Mapping[str, Any]) -> bytes:
    """A masked upload: safetensors with one uint64 tensor and string metadata."""
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in metadata.items()}
    meta["format"] = MASKED_FORMAT
    return _st_save({MASKED_TENSOR: np.ascontiguousarray(vector, dtype=np.uint64)}, metadata=meta)


def decode_masked(data: bytes, length: int) -> np.ndarray:
    """The masked vector of an upload, checked for dtype and length."""
    try:
        tensors = _st_load(bytes(data))
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise ProtocolError(f"body is not a valid safetensors file: {exc}") from None
    vector = tensors.get(MASKED_TENSOR)
    if set(tensors) != {MASKED_TENSOR} or vector is None:
        raise ProtocolError(f"a masked upload holds exactly one tensor '{MASKED_TENSOR}'")
    if vector.dtype != np.uint64 or vector.shape != (length,):
        raise ProtocolError(
            f"the masked vector must be uint64 of shape [{length}]; got {vector.dtype} {list(vector.shape)}"
        )
    return vector
