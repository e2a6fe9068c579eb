"""Bearer tokens: made random, stored only as their sha256."""

from __future__ import annotations

import hashlib
import secrets


def hash_token(token: str) -> str:
    """Tokens are stored only as their sha256 (they are long random strings, so no salt is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str) -> str:
    """A fresh random bearer token with a readable prefix."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"
