"""The error types, kept importable from here; they live in :mod:`relax.errors`, which every
package may import."""

from relax.errors import (  # noqa: F401
    InputError,
    Interrupted,
    NonFiniteError,
    PeerFailure,
    RelaxError,
    RewardError,
)
