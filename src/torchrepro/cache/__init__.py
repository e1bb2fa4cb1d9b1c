"""Compile caches: inventory, why a lookup missed, warm-start packs, per-rank policies."""
