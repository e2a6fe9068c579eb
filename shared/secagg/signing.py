"""Ed25519 signatures that bind a secure round to the clients' identities (Bonawitz et al.'s active
model, with the coordinator as the registry of signing keys).

- Each client holds one Ed25519 signing key for a federation (kept in its state directory). Its
  public half travels in every key advertisement; the coordinator pins it to the client's enrolment
  identity the first time it is shown and refuses any other afterwards, and every client pins the
  keys it has seen by client id (a key substituted later is refused by both).
- A key advertisement (round keys and self-mask commitment) is signed with it, bound to the round
  and the client's number and id (``keys_message``): a neighbour refuses keys not signed by the key
  it pinned for that client.
- The roster of a round (every advertisement the coordinator accepted, by number) hashes to the
  seed of the neighbourhood graph (``roster_seed``): the coordinator learns the seed only once every
  key is in, cannot choose it, and every client recomputes it.
- After the masked uploads each client signs the survivor set it was given together with the roster
  seed (``consistency_message``); a client reveals shares only when at least t of its neighbours
  signed the same set (the consistency check of Bonawitz et al.).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_BYTES = 32
SIGNATURE_BYTES = 64
ADVERT_FIELDS = ("encryption_key", "mask_key", "seed_commitment", "signing_key", "signature")


def new_signing_key() -> bytes:
    """A fresh Ed25519 private key (raw 32 bytes) from the OS CSPRNG."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def public_key(private: bytes) -> bytes:
    """The raw 32-byte public half of an Ed25519 private key."""
    return (
        Ed25519PrivateKey.from_private_bytes(private)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def sign(private: bytes, message: bytes) -> bytes:
    """The Ed25519 signature of `message` (deterministic: the same bytes every time)."""
    return Ed25519PrivateKey.from_private_bytes(private).sign(message)


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    """Whether `signature` is `public`'s signature of `message`."""
    if len(public) != PUBLIC_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def keys_message(context: bytes, index: int, client_id: int, advert: Mapping[str, Any]) -> bytes:
    """What a client signs when it advertises its round keys."""
    parts = [str(advert[k]) for k in ("encryption_key", "mask_key", "seed_commitment", "signing_key")]
    return (
        b"fedprompt secagg keys|"
        + context
        + f"|index={index}|client={client_id}|".encode()
        + "|".join(parts).encode()
    )


def roster_digest(client_id: int, advert: Mapping[str, Any]) -> str:
    """The hex sha256 of one signed advertisement and the client id it belongs to."""
    body = {"client_id": int(client_id), **{k: str(advert[k]) for k in ADVERT_FIELDS}}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def roster_seed(context: bytes, roster: Mapping[int, str]) -> bytes:
    """The seed of the round's neighbourhood graph: sha256 of the round and its roster (number ->
    digest of the signed advertisement), in number order."""
    lines = "\n".join(f"{int(i)}:{roster[i]}" for i in sorted(roster, key=int))
    return hashlib.sha256(b"fedprompt secagg graph|" + context + b"|" + lines.encode()).digest()


def consistency_message(context: bytes, seed: bytes, survivors: Iterable[int]) -> bytes:
    """What a client signs for the consistency check: the round, its roster seed and the survivors."""
    listed = ",".join(str(i) for i in sorted(int(j) for j in survivors))
    return b"fedprompt secagg survivors|" + context + b"|" + seed.hex().encode() + b"|" + listed.encode()
