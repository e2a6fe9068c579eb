"""The AES-GCM envelopes in which a client's shares travel to a neighbour through the coordinator.

Sender i and recipient j derive a 256-bit key from the X25519 agreement of their encryption keys
(HKDF-SHA256, bound to the round); the envelope is a random 96-bit nonce followed by the AES-GCM
ciphertext of (i, j, share of i's self-mask seed, share of i's mask private key), authenticated with
the round and both indices as associated data. The coordinator relays envelopes it cannot open, and a
recipient refuses one that was altered, replayed from another round or addressed to someone else.
"""

from __future__ import annotations

import secrets
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fedprompt.shared.secagg.masks import derive_key
from fedprompt.shared.secagg.shamir import SHARE_BYTES, share_from_bytes, share_to_bytes

NONCE_BYTES = 12
_HEADER = struct.Struct(">II")
PLAINTEXT_BYTES = _HEADER.size + 2 * SHARE_BYTES
ENVELOPE_BYTES = NONCE_BYTES + PLAINTEXT_BYTES + 16


class EnvelopeError(ValueError):
    """An envelope that does not open: altered, misaddressed or from another round."""


def _aad(context: bytes, sender: int, recipient: int) -> bytes:
    return b"fedprompt secagg shares|" + context + _HEADER.pack(sender, recipient)


def seal(
    own_encryption_private: bytes,
    peer_encryption_public: bytes,
    context: bytes,
    sender: int,
    recipient: int,
    seed_share: int,
    key_share: int,
) -> bytes:
    """The envelope of sender's two shares for recipient."""
    key = derive_key(own_encryption_private, peer_encryption_public, b"fedprompt secagg envelope|" + context)
    plaintext = _HEADER.pack(sender, recipient) + share_to_bytes(seed_share) + share_to_bytes(key_share)
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, _aad(context, sender, recipient))


def open_envelope(
    own_encryption_private: bytes,
    peer_encryption_public: bytes,
    context: bytes,
    sender: int,
    recipient: int,
    envelope: bytes,
) -> tuple[int, int]:
    """(share of the sender's self-mask seed, share of its mask private key), or EnvelopeError."""
    if len(envelope) != ENVELOPE_BYTES:
        raise EnvelopeError(f"an envelope is {ENVELOPE_BYTES} bytes; got {len(envelope)}")
    key = derive_key(own_encryption_private, peer_encryption_public, b"fedprompt secagg envelope|" + context)
    try:
        plaintext = AESGCM(key).decrypt(
            envelope[:NONCE_BYTES], envelope[NONCE_BYTES:], _aad(context, sender, recipient)
        )
    except InvalidTag:
        raise EnvelopeError(f"the envelope from {sender} to {recipient} does not authenticate") from None
    if _HEADER.unpack(plaintext[: _HEADER.size]) != (sender, recipient):
        raise EnvelopeError("the envelope names other clients")
    body = plaintext[_HEADER.size :]
    return share_from_bytes(body[:SHARE_BYTES]), share_from_bytes(body[SHARE_BYTES:])
