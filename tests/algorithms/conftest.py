"""Shared settings for the algorithm tests: a modest, deterministic hypothesis profile."""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "relax",
    max_examples=75,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("relax")
