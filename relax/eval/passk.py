"""The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained
on Code", Eq. 1).

With ``n`` samples of one prompt of which ``c`` pass, the probability that at least one of
``k`` samples drawn without replacement passes is

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)``, which never forms a large binomial
coefficient. The benchmark value is the mean over prompts. Pure Python: no torch needed.
"""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``n`` samples, ``c`` of them passing; ``1 <= k <= n``."""
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"pass_at_k takes integers, got n={n!r} c={c!r} k={k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need n >= 1 and 0 <= c <= n, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k={k} must lie in [1, n={n}]: k samples are drawn from n")
    if n - c < k:  # every k-subset holds a passing sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def ks_for(n: int) -> list[int]:
    """The k reported for ``n`` samples per prompt: the powers of two below ``n``, then ``n``."""
    if n < 1:
        raise ValueError(f"need n >= 1 samples per prompt, got {n}")
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """Mean pass@k over prompts given ``(n, c)`` per prompt."""
    if not counts:
        raise ValueError("mean_pass_at_k: no prompts")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
