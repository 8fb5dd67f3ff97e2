"""API tokens: random, shown once, stored as a hash.

Tokens carry 256 bits of randomness, so a plain SHA-256 is enough to make the stored hash
useless to an attacker; a slow password hash would only cost every request time.
"""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "calve_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
