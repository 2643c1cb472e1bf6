"""The sampling section (``cfg.rollout.sampling``): how the rollout samples its responses.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import FLOAT32, Section, option

# Upper bound on the tokens one response (one turn) may ask for, checked before anything is
# built: far above published setups, low enough that exceeding it is a typo
# (--rollout-max-response-len and --eval-max-response-len)
MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class SamplingSection(Section):
    """How the rollout samples its responses."""

    rollout_max_response_len: int = option(
        1024,
        'Maximum generated tokens per response; longer ones are truncated.',
        bound=((lambda v: v >= 1, "must be >= 1 tokens"),
               (lambda v: v <= MAX_TOKENS, f"must be <= {MAX_TOKENS} tokens")))
    rollout_temperature: float = option(
        1.0,
        'Sampling temperature > 0.',
        bound=((lambda v: v > 0.0, "must be > 0; use 1.0 for plain sampling"), FLOAT32))
    rollout_top_p: float = option(
        1.0,
        'Nucleus sampling mass in (0, 1].',
        default_note='off',
        bound=(lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 to turn it off"))
    rollout_top_k: int = option(
        -1,
        'Top-k sampling, >= 1 or -1.',
        default_note='off',
        bound=(lambda v: v == -1 or v >= 1, "must be >= 1, or -1 to turn top-k off"))
