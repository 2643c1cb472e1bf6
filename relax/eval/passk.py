"""The unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models Trained
on Code", Eq. 1).

With ``n`` samples of one prompt of which ``c`` pass, the probability that at least one of
``k`` samples drawn without replacement passes is

    pass@k = 1 - C(n - c, k) / C(n, k)

computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)``, which never forms a large binomial
coefficient. The benchmark value is the mean over prompts. Pure Python: no torch needed.

:class:`PassAtKSums` accumulates one evaluation (prompts or ``--env`` episodes) as flat sums
that one all-reduce makes global, and turns them into the ``eval/<name>/...`` metrics.
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


class PassAtKSums:
    """Weighted sums over groups of ``n_samples`` samples (the responses of one prompt, the
    plays of one episode seed), in one flat list so that one all-reduce makes them global.

        sums = PassAtKSums(4, pass_threshold=1.0, means=("response_length", "truncated"))
        sums.add_group(rewards, response_length=lengths, truncated=flags)  # 4 values each
        metrics = sums.metrics("gsm8k", totals=all_reduced(sums.values))

    Layout of :attr:`values`: pass@k for each k of :func:`ks_for`, reward, samples, groups,
    then one sum per name in ``means``. A sample passes when its reward is >= the threshold.
    """

    def __init__(self, n_samples: int, pass_threshold: float, means: tuple[str, ...] = ()):
        self.n, self.ks, self.pass_threshold = n_samples, ks_for(n_samples), pass_threshold
        self.means = tuple(means)
        self.values = [0.0] * (len(self.ks) + 3 + len(self.means))

    def add_group(self, rewards: list[float], weight: float = 1.0, **per_sample) -> None:
        """One group's ``n_samples`` rewards and, for each name in ``means``, its per-sample
        values. ``weight`` 0 counts nothing (a padded duplicate that keeps ranks in step)."""
        if len(rewards) != self.n or set(per_sample) != set(self.means):
            raise ValueError(f"add_group: expected {self.n} rewards and the values "
                             f"{self.means}, got {len(rewards)} and {tuple(per_sample)}")
        passed = sum(r >= self.pass_threshold for r in rewards)
        terms = [pass_at_k(self.n, passed, k) for k in self.ks]
        terms += [sum(rewards), self.n, 1, *(sum(per_sample[m]) for m in self.means)]
        for i, term in enumerate(terms):
            self.values[i] += weight * term

    def metrics(self, name: str, totals: list[float] | None = None) -> dict[str, float]:
        """``eval/<name>/pass@k`` (mean over groups), ``mean_reward`` and each of ``means``
        (means over samples), from ``totals`` (the all-reduced :attr:`values`) or the local
        sums."""
        values = list(self.values if totals is None else totals)
        n_ks = len(self.ks)
        reward, samples, groups = values[n_ks:n_ks + 3]
        out = {f"eval/{name}/pass@{k}": values[a] / groups for a, k in enumerate(self.ks)}
        out[f"eval/{name}/mean_reward"] = reward / samples
        for m, total in zip(self.means, values[n_ks + 3:], strict=True):
            out[f"eval/{name}/{m}"] = total / samples
        return out
