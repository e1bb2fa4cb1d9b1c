"""Fast bitwise fingerprints (placeholder: being written)."""

from __future__ import annotations

import xxhash


def hash_bytes(*buffers) -> str:
    """xxh3-128 of the concatenated buffers, as 32 hex characters."""
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(b)
    return h.hexdigest()
