"""Independent float64 reference for the algorithm contract (reinforce_plus_plus.md §1-§7, §10).

Written from docs/algorithms/reinforce_plus_plus.md only, with plain Python loops over explicit
positions and numpy
float64 scalars. It imports nothing from ``relax`` and never reads a value at a masked
position (every access sits behind an explicit ``if mask[i, t]``), so NaN/Inf sentinels
outside the mask cannot reach a result here either.

Inputs may be numpy arrays, nested lists or CPU torch tensors (any float dtype); every
function converts them to float64 numpy first. Outputs are float64 numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

VAR_FLOOR = 1e-8  # §6: floor on the variance, not an epsilon added to the std
GROUP_STD_EPS = 1e-6  # §5: A / (std + 1e-6)
WHITEN_EPS = 1e-8  # §5: (A - mu) * rsqrt(var + 1e-8)


def f64(x) -> np.ndarray:
    """Any array-like (torch tensors included, bf16 too) -> float64 numpy array."""
    if hasattr(x, "detach"):  # a torch tensor; no torch import needed here
        x = x.detach().cpu().double().numpy()
    return np.array(x, dtype=np.float64, copy=True)


def as_mask(mask) -> np.ndarray:
    """§1: a numeric mask is read as ``mask != 0``."""
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu()
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            mask = mask.double()
        mask = mask.numpy()
    return np.asarray(mask) != 0


def as_index(index) -> list[int]:
    if hasattr(index, "detach"):
        index = index.detach().cpu().numpy()
    return [int(v) for v in np.asarray(index).reshape(-1)]


# --------------------------------------------------------------------------- KL (§2)


def kl_scalar(delta: float, kind: str) -> float:
    if kind == "k1":
        return delta
    if kind == "k2":
        return 0.5 * delta * delta
    if kind == "k3":
        return math.exp(-delta) - 1.0 + delta
    if kind == "low_var_kl":
        return min(max(math.exp(-delta) - 1.0 + delta, -10.0), 10.0)
    raise ValueError(kind)


def approx_kl(logp, logp_base, kind: str) -> np.ndarray:
    a, b = f64(logp), f64(logp_base)
    out = np.zeros(a.shape, dtype=np.float64)
    for idx in np.ndindex(a.shape):
        out[idx] = kl_scalar(float(a[idx]) - float(b[idx]), kind)
    return out


# ------------------------------------------------------------------ returns (§3)


def rpp_returns(rewards, old_log_probs, ref_log_probs, mask, *, kl_coef: float,
                gamma: float = 1.0) -> np.ndarray:
    """G[i,t] = m * sum_{u=t}^{T_i} gamma^(u-t) r[i,u], r = m*(-beta*d + 1(t=T_i) R_i).

    Backward recursion acc_t = r_t + gamma * acc_{t+1} over every position (holes
    included, where r = 0), which is the definition evaluated exactly in float64.
    """
    m = as_mask(mask)
    B, T = m.shape
    R = f64(rewards)
    old = f64(old_log_probs) if old_log_probs is not None else None
    ref = f64(ref_log_probs) if ref_log_probs is not None else None
    G = np.zeros((B, T), dtype=np.float64)
    for i in range(B):
        valid = [t for t in range(T) if m[i, t]]
        if not valid:
            continue  # L_i = 0: all-zero returns; R_i is never read
        last = valid[-1]
        acc = 0.0
        for t in range(last, -1, -1):
            r = 0.0
            if m[i, t]:
                if kl_coef != 0.0:
                    r -= kl_coef * (float(old[i, t]) - float(ref[i, t]))
                if t == last:
                    r += float(R[i])
            acc = r + gamma * acc
            if m[i, t]:
                G[i, t] = acc
    return G


# --------------------------------------------------------------- baselines (§4, §5)


def _groups(group_index) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(as_index(group_index)):
        groups.setdefault(g, []).append(i)
    return groups


def baseline_advantages(rewards, group_index, mask) -> np.ndarray:
    """A_raw[i,t] = m * (R_i - mean_{j in g(i)} R_j), inclusive mean, every member counts."""
    m = as_mask(mask)
    R = f64(rewards)
    out = np.zeros(m.shape, dtype=np.float64)
    for members in _groups(group_index).values():
        mean = sum(float(R[j]) for j in members) / len(members)
        for i in members:
            c = float(R[i]) - mean
            for t in range(m.shape[1]):
                if m[i, t]:
                    out[i, t] = c
    return out


def group_relative_advantages(rewards, group_index, mask, *,
                              std_normalization: bool = True) -> np.ndarray:
    """A_i = (R_i - mean_g) / (std_g(ddof=1) + 1e-6); std of a one-member group is 0."""
    m = as_mask(mask)
    R = f64(rewards)
    out = np.zeros(m.shape, dtype=np.float64)
    for members in _groups(group_index).values():
        n = len(members)
        mean = sum(float(R[j]) for j in members) / n
        var = sum((float(R[j]) - mean) ** 2 for j in members) / (n - 1) if n > 1 else 0.0
        std = math.sqrt(var)
        for i in members:
            a = float(R[i]) - mean
            if std_normalization:
                a = a / (std + GROUP_STD_EPS)
            for t in range(m.shape[1]):
                if m[i, t]:
                    out[i, t] = a
    return out


def rloo_advantages(rewards, group_index, mask) -> np.ndarray:
    """§5a: A_i = R_i - mean of the OTHER members' rewards (a group of one: A = 0)."""
    m = as_mask(mask)
    R = f64(rewards)
    out = np.zeros(m.shape, dtype=np.float64)
    for members in _groups(group_index).values():
        for i in members:
            others = [float(R[j]) for j in members if j != i]
            a = float(R[i]) - sum(others) / len(others) if others else 0.0
            for t in range(m.shape[1]):
                if m[i, t]:
                    out[i, t] = a
    return out


# ---------------------------------------------------------- normalization (§5, §6)


@dataclass
class RefStats:
    mean: float
    var: float
    count: int
    zero_variance: bool
    normalized_mean: float
    normalized_std: float


def _valid_values(values_list, mask_list) -> list[float]:
    """The population: every valid token of every (rank's) tensor, in a flat list."""
    vals = []
    for values, mask in zip(values_list, mask_list, strict=True):
        v, m = f64(values), as_mask(mask)
        for idx in np.ndindex(m.shape):
            if m[idx]:
                vals.append(float(v[idx]))
    return vals


def _pop_moments(vals: list[float]) -> tuple[float, float]:
    n = len(vals)
    mean = sum(vals) / n
    var = sum((x - mean) ** 2 for x in vals) / n
    return mean, var


def population_normalize(values_list, mask_list, *, var_floor: float = VAR_FLOOR):
    """§6 over the concatenated population of several ranks' tensors.

    ``values_list``/``mask_list``: one entry per rank (a single-process call passes
    one-element lists). Returns (list of normalized arrays, RefStats). N = 0 raises.
    """
    vals = _valid_values(values_list, mask_list)
    if not vals:
        raise RuntimeError("empty global mask")
    mean, var = _pop_moments(vals)
    scale = 1.0 / math.sqrt(max(var, var_floor))
    outs = []
    for values, mask in zip(values_list, mask_list, strict=True):
        v, m = f64(values), as_mask(mask)
        out = np.zeros(m.shape, dtype=np.float64)
        for idx in np.ndindex(m.shape):
            if m[idx]:
                out[idx] = (float(v[idx]) - mean) * scale
        outs.append(out)
    nmean, nvar = _pop_moments(_valid_values(outs, mask_list))
    stats = RefStats(mean, var, len(vals), var < var_floor, nmean, math.sqrt(nvar))
    return outs, stats


def whiten(values_list, mask_list, *, eps: float = WHITEN_EPS) -> list[np.ndarray]:
    """§5 masked_whiten: global mean, ddof=1 variance (N = 1 -> 0), rsqrt(var + eps)."""
    vals = _valid_values(values_list, mask_list)
    n = len(vals)
    mean = sum(vals) / n
    var = sum((x - mean) ** 2 for x in vals) / (n - 1) if n > 1 else 0.0
    scale = 1.0 / math.sqrt(var + eps)
    outs = []
    for values, mask in zip(values_list, mask_list, strict=True):
        v, m = f64(values), as_mask(mask)
        out = np.zeros(m.shape, dtype=np.float64)
        for idx in np.ndindex(m.shape):
            if m[idx]:
                out[idx] = (float(v[idx]) - mean) * scale
        outs.append(out)
    return outs


# ------------------------------------------------------------------ losses (§7)


def _clip_token(rho: float, a: float, eps_low: float, eps_high: float,
                c: float | None) -> tuple[float, bool]:
    unclipped = -rho * a
    clipped = -min(max(rho, 1.0 - eps_low), 1.0 + eps_high) * a
    pg = max(unclipped, clipped)
    if c is not None and a < 0:
        pg = min(pg, -c * a)
    return pg, clipped > unclipped


def ppo_clip_loss(log_probs, old_log_probs, advantages, mask, *, eps_clip=0.2,
                  eps_clip_high=None, eps_clip_c=None):
    """Returns (pg [B,T], clipped [B,T] bool); clipped = clipped branch strictly larger."""
    lp, old, A, m = f64(log_probs), f64(old_log_probs), f64(advantages), as_mask(mask)
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    pg = np.zeros(m.shape, dtype=np.float64)
    flags = np.zeros(m.shape, dtype=bool)
    for idx in np.ndindex(m.shape):
        if m[idx]:
            rho = math.exp(float(lp[idx]) - float(old[idx]))
            pg[idx], flags[idx] = _clip_token(rho, float(A[idx]), eps_clip, eps_high, eps_clip_c)
    return pg, flags


def gspo_ratios(log_probs, old_log_probs, mask) -> np.ndarray:
    """s_i = exp(mean over valid tokens of (logp - logp_old)); 1.0 for L_i = 0 rows."""
    lp, old, m = f64(log_probs), f64(old_log_probs), as_mask(mask)
    s = np.ones(m.shape[0], dtype=np.float64)
    for i in range(m.shape[0]):
        ds = [float(lp[i, t]) - float(old[i, t]) for t in range(m.shape[1]) if m[i, t]]
        if ds:
            s[i] = math.exp(sum(ds) / len(ds))
    return s


def gspo_loss(log_probs, old_log_probs, advantages, mask, *, eps_clip=0.2, eps_clip_high=None):
    A, m = f64(advantages), as_mask(mask)
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    s = gspo_ratios(log_probs, old_log_probs, mask)
    pg = np.zeros(m.shape, dtype=np.float64)
    flags = np.zeros(m.shape, dtype=bool)
    for idx in np.ndindex(m.shape):
        if m[idx]:
            pg[idx], flags[idx] = _clip_token(float(s[idx[0]]), float(A[idx]), eps_clip,
                                              eps_high, None)
    return pg, flags


def sapo_loss(log_probs, old_log_probs, advantages, mask, *, tau_pos=1.0, tau_neg=1.05):
    """pg = -f(rho) * A, f(rho) = 4 sigmoid(tau (rho - 1)) / tau, tau by the sign of A."""
    lp, old, A, m = f64(log_probs), f64(old_log_probs), f64(advantages), as_mask(mask)
    pg = np.zeros(m.shape, dtype=np.float64)
    for idx in np.ndindex(m.shape):
        if m[idx]:
            rho = math.exp(float(lp[idx]) - float(old[idx]))
            a = float(A[idx])
            tau = tau_pos if a > 0 else tau_neg
            z = tau * (rho - 1.0)
            sig = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            pg[idx] = -(4.0 * sig / tau) * a
    return pg


def cispo_loss(log_probs, old_log_probs, advantages, mask, *, eps_clip=0.2, eps_clip_high=None):
    """§5b: pg = -w * A * logp, w = min(rho, 1 + eps_high) for A >= 0, max(rho, 1 - eps_low)
    for A < 0. Returns (pg, w, clipped), all [B, T]; w is the constant d pg / d logp = -w A."""
    lp, old, A, m = f64(log_probs), f64(old_log_probs), f64(advantages), as_mask(mask)
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    pg, w = np.zeros(m.shape), np.zeros(m.shape)
    flags = np.zeros(m.shape, dtype=bool)
    for idx in np.ndindex(m.shape):
        if m[idx]:
            rho, a = math.exp(float(lp[idx]) - float(old[idx])), float(A[idx])
            bounded = min(rho, 1.0 + eps_high) if a >= 0 else max(rho, 1.0 - eps_clip)
            w[idx], flags[idx] = bounded, bounded != rho
            pg[idx] = -bounded * a * float(lp[idx])
    return pg, w, flags


def rloo_loss(log_probs, advantages, mask) -> np.ndarray:
    """§5a: pg = -A * logp on valid tokens (no ratio)."""
    lp, A, m = f64(log_probs), f64(advantages), as_mask(mask)
    pg = np.zeros(m.shape)
    for idx in np.ndindex(m.shape):
        if m[idx]:
            pg[idx] = -float(A[idx]) * float(lp[idx])
    return pg


def response_mean(values, mask, *, num_responses=None) -> float:
    """(1/B) sum_i (1/L_i) sum_t m v; L_i = 0 rows count in B and add 0."""
    v, m = f64(values), as_mask(mask)
    B = m.shape[0] if num_responses is None else num_responses
    total = 0.0
    for i in range(m.shape[0]):
        row = [float(v[i, t]) for t in range(m.shape[1]) if m[i, t]]
        if row:
            total += sum(row) / len(row)
    return total / B


def token_mean(values, mask, *, num_tokens=None) -> float:
    v, m = f64(values), as_mask(mask)
    row = [float(v[idx]) for idx in np.ndindex(m.shape) if m[idx]]
    n = len(row) if num_tokens is None else num_tokens
    return sum(row) / n


# ----------------------------------------------------------- dispatcher (§3-§6, §10)


def masked_token_mean_global(values_list, mask_list) -> float:
    vals = _valid_values(values_list, mask_list)
    return sum(vals) / len(vals)


def advantages_and_returns(estimator: str, rewards, mask, *, group_index=None,
                           old_log_probs=None, ref_log_probs=None, normalize_advantages=False,
                           gamma=1.0, kl_coef=0.0, std_normalization=True):
    """Single-process reference of the dispatcher: (advantages, returns, metrics dict).

    Metric definitions (common brief): raw_reward = mean of rewards over responses;
    returns / advantages = masked token means; raw_* = population moments before
    normalization; normalized_* = population moments of the final advantages;
    zero_variance = raw var < 1e-8; valid_tokens = N.
    """
    m = as_mask(mask)
    if estimator == "reinforce_plus_plus":
        raw = rpp_returns(rewards, old_log_probs, ref_log_probs, m, kl_coef=kl_coef, gamma=gamma)
        returns = raw
    elif estimator == "reinforce_plus_plus_baseline":
        raw = baseline_advantages(rewards, group_index, m)
        returns = raw
    elif estimator in ("grpo", "gspo", "sapo", "cispo"):
        raw = group_relative_advantages(rewards, group_index, m,
                                        std_normalization=std_normalization)
        returns = raw
    elif estimator == "rloo":
        assert not normalize_advantages, "§5a: rloo is never normalized"
        raw = returns = rloo_advantages(rewards, group_index, m)
    else:
        raise ValueError(estimator)
    vals = _valid_values([raw], [m])
    raw_mean, raw_var = _pop_moments(vals)
    if estimator.startswith("reinforce_plus_plus"):
        (adv,), _ = population_normalize([raw], [m])
    elif normalize_advantages:
        (adv,) = whiten([raw], [m])
    else:
        adv = raw.copy()
    n_mean, n_var = _pop_moments(_valid_values([adv], [m]))
    R = f64(rewards)
    metrics = {
        "rollout/raw_reward": float(np.mean(R)),
        "rollout/returns": masked_token_mean_global([returns], [m]),
        "rollout/advantages": masked_token_mean_global([adv], [m]),
        "rollout/advantage_raw_mean": raw_mean,
        "rollout/advantage_raw_std": math.sqrt(raw_var),
        "rollout/advantage_normalized_mean": n_mean,
        "rollout/advantage_normalized_std": math.sqrt(n_var),
        "rollout/valid_tokens": float(len(vals)),
        "rollout/advantage_zero_variance": 1.0 if raw_var < VAR_FLOOR else 0.0,
    }
    return adv, returns, metrics


# -------------------------------------------------------------- §7a the sampler's log-probs

def mismatch(trainer_lp, sampler_lp, mask) -> dict[str, float]:
    """§7a sums over masked tokens of d = q - s: count, |d|, max |d|, -d, e^d - 1 - d, and
    the count of ratios e^d outside [0.5, 2]."""
    q, s, m = f64(trainer_lp), f64(sampler_lp), as_mask(mask)
    out = dict(tokens=0.0, abs_diff=0.0, abs_diff_max=0.0, k1=0.0, k3=0.0, outside=0.0)
    for i in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[i, t]:
                d = q[i, t] - s[i, t]
                out["tokens"] += 1
                out["abs_diff"] += abs(d)
                out["abs_diff_max"] = max(out["abs_diff_max"], abs(d))
                out["k1"] += -d
                out["k3"] += math.exp(d) - 1.0 - d
                out["outside"] += float(not 0.5 <= math.exp(d) <= 2.0)
    return out


def tis(trainer_lp, sampler_lp, mask, *, clip: float, clip_low: float):
    """§7a truncated importance weight per masked token (0 elsewhere) and where it clipped."""
    q, s, m = f64(trainer_lp), f64(sampler_lp), as_mask(mask)
    w = np.zeros(m.shape)
    clipped = np.zeros(m.shape, dtype=bool)
    for i in range(m.shape[0]):
        for t in range(m.shape[1]):
            if m[i, t]:
                r = math.exp(q[i, t] - s[i, t])
                w[i, t] = min(max(r, clip_low), clip)
                clipped[i, t] = r > clip or r < clip_low
    return w, clipped


def opsm(log_probs, sampler_lp, advantages, mask, *, delta: float) -> np.ndarray:
    """§7a: keep[i] False when sum_t A < 0 and mean_t (s - log pi_theta) > delta."""
    lp, s, a, m = f64(log_probs), f64(sampler_lp), f64(advantages), as_mask(mask)
    keep = np.ones(m.shape[0], dtype=bool)
    for i in range(m.shape[0]):
        ts = [t for t in range(m.shape[1]) if m[i, t]]
        if ts:
            divergence = sum(s[i, t] - lp[i, t] for t in ts) / len(ts)
            keep[i] = not (sum(a[i, t] for t in ts) < 0 and divergence > delta)
    return keep


def advantage_section(estimator: str, std_normalization: bool = True, **kw):
    """The algorithm section the dispatcher takes, from the keywords this module's
    ``compute_advantages_and_returns`` takes (``estimator`` is the section's
    ``advantage_estimator``, ``std_normalization`` its ``disable_grpo_std_normalization``
    negated)."""
    from relax.config.sections import AlgorithmSection
    return AlgorithmSection(advantage_estimator=estimator,
                            disable_grpo_std_normalization=not std_normalization, **kw)
