"""The one seed derivation: every random stream of a run (rollout, evaluation, LoRA init,
environment seeds) is seeded from the run's ``--seed`` and the names of what it is for.

Pure Python, so the lightest modules may use it.
"""

from __future__ import annotations

import hashlib


def seed_for(*parts) -> int:
    """A 63-bit seed from (seed, rank, step, ...): independent streams without collisions."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
