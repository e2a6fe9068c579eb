"""Pairwise and self masks in Z_2^64, from X25519 key agreement, HKDF and an AES-CTR stream.

Clients i and j agree on a secret with X25519 (i's private key, j's public key, and the reverse give
the same bytes), HKDF-SHA256 turns it into a 32-byte seed bound to the round, and AES-256-CTR under
that seed expands it into a mask of the update's length. The client with the smaller index adds the
pairwise mask, the other subtracts it, so in the sum of both masked vectors it cancels. Each client
also adds a self mask from a seed of its own (b_i), which the coordinator may only learn for clients
whose masked vector arrived; for a client that dropped after sharing its keys, the coordinator learns
its key-agreement private key instead, recomputes its pairwise masks with the survivors and removes
them from the sum.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32
KEY_BYTES = 32


def new_private_key() -> X25519PrivateKey:
    """A fresh X25519 private key from the OS CSPRNG."""
    return X25519PrivateKey.generate()


def private_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of an X25519 private key (what is secret-shared)."""
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The raw 32 bytes of its public key (what is advertised)."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_from_bytes(data: bytes) -> X25519PrivateKey:
    """An X25519 private key from its raw bytes."""
    return X25519PrivateKey.from_private_bytes(data)


def new_seed() -> bytes:
    """A self-mask seed b_i from the OS CSPRNG."""
    return secrets.token_bytes(SEED_BYTES)


def derive_key(private: bytes, peer_public: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 of the X25519 agreement of `private` with `peer_public`, bound to `info`."""
    shared = private_from_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(shared)


def pairwise_seed(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The seed of the pairwise mask of two clients in one round (the same from either side)."""
    return derive_key(private, peer_public, b"fedprompt secagg pairwise mask|" + context)


def expand(seed: bytes, length: int) -> npt.NDArray[np.uint64]:
    """`length` uint64 values of the AES-256-CTR keystream under `seed` (a pseudo-random mask)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed is {SEED_BYTES} bytes; got {len(seed)}")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(b"\x00" * 16)).encryptor()
    stream = encryptor.update(b"\x00" * (8 * length)) + encryptor.finalize()
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def pairwise_sign(own: int, peer: int) -> int:
    """+1 if `own` adds the pair's mask (the smaller index), −1 if it subtracts it."""
    if own == peer:
        raise ValueError("a client has no pairwise mask with itself")
    return 1 if own < peer else -1


def mask(vector: np.ndarray, own: int, self_seed: bytes, pair_seeds: Mapping[int, bytes]) -> np.ndarray:
    """y = x + PRG(b) + Σ_j ±PRG(s_ij)  (mod 2^64): the vector a client uploads."""
    x = np.asarray(vector, dtype=np.uint64)
    masked = x + expand(self_seed, x.size)
    for peer, seed in pair_seeds.items():
        if pairwise_sign(own, peer) > 0:
            masked = masked + expand(seed, x.size)
        else:
            masked = masked - expand(seed, x.size)
    return masked


def unmask(
    total: np.ndarray,
    self_seeds: Iterable[bytes],
    dropped_pairs: Iterable[tuple[int, int, bytes]],
) -> np.ndarray:
    """The sum of the survivors' vectors from the sum of their masked vectors: subtract every
    survivor's self mask, and undo each pairwise mask a survivor shared with a client that dropped,
    given as (survivor, dropped, seed)."""
    out = np.asarray(total, dtype=np.uint64).copy()
    for seed in self_seeds:
        out = out - expand(seed, out.size)
    for survivor, dropped, seed in dropped_pairs:
        if pairwise_sign(survivor, dropped) > 0:
            out = out - expand(seed, out.size)
        else:
            out = out + expand(seed, out.size)
    return out
