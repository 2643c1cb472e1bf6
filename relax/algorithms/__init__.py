"""Pure tensor math of Relax: KL estimators, advantages, normalization, policy losses.

Importable without a model, a GPU or a process group (reinforce_plus_plus.md §13). Formulas live in
one place each:

=============================  =====================================  ==========
name                           module                                 reinforce_plus_plus.md
=============================  =====================================  ==========
approx_kl                      :mod:`relax.algorithms.kl`             2
reinforce_plus_plus_returns    :mod:`relax.algorithms.advantages`     3
reinforce_plus_plus_baseline_  :mod:`relax.algorithms.advantages`     4
advantages
group_relative_advantages      :mod:`relax.algorithms.advantages`     5
rloo_advantages                :mod:`relax.algorithms.advantages`     5a
masked_population_normalize    :mod:`relax.algorithms.normalization`  6
masked_whiten                  :mod:`relax.algorithms.normalization`  5
ppo_clip_loss, gspo_loss,      :mod:`relax.algorithms.losses`         7
sapo_loss, response_mean,
token_mean
rloo_loss                      :mod:`relax.algorithms.losses`         5a
cispo_loss                     :mod:`relax.algorithms.losses`         5b
compute_advantages_and_returns :mod:`relax.algorithms.registry`       3-6, 10
mismatch_sums, tis_weights,    :mod:`relax.algorithms.sampler_mismatch`     7a
opsm_keep
importance_weights,            :mod:`relax.algorithms.rollout_correction`   7c
rejection_keep, veto_keep
distilled_advantages,          :mod:`relax.algorithms.distillation`   7b
opd_reverse_kl, opd_metrics
generalized_jsd,               :mod:`relax.algorithms.self_distillation`  7b
opsd_token_terms
gae_advantages, gae_returns,   :mod:`relax.algorithms.value`          5c
clipped_value_loss,
value_statistics
=============================  =====================================  ==========
"""

from relax.algorithms.advantages import (
    group_relative_advantages,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    rloo_advantages,
)
from relax.algorithms.distillation import (
    OPD_TERMS,
    distilled_advantages,
    opd_metrics,
    opd_reverse_kl,
)
from relax.algorithms.kl import KL_KINDS, approx_kl
from relax.algorithms.losses import (
    cispo_loss,
    gspo_loss,
    ppo_clip_loss,
    response_mean,
    rloo_loss,
    sapo_loss,
    token_mean,
)
from relax.algorithms.normalization import (
    NormalizationStats,
    masked_population_normalize,
    masked_whiten,
)
from relax.algorithms.registry import (
    ESTIMATORS,
    AdvantageOutput,
    Estimator,
    compute_advantages_and_returns,
    compute_policy_loss,
    get_estimator,
)
from relax.algorithms.rollout_correction import importance_weights, rejection_keep, veto_keep
from relax.algorithms.sampler_mismatch import mismatch_sums, opsm_keep, tis_weights
from relax.algorithms.self_distillation import generalized_jsd, opsd_token_terms
from relax.algorithms.value import (
    clipped_value_loss,
    gae_advantages,
    gae_returns,
    terminal_rewards,
    value_statistics,
)

__all__ = [
    "KL_KINDS",
    "ESTIMATORS",
    "AdvantageOutput",
    "Estimator",
    "NormalizationStats",
    "OPD_TERMS",
    "approx_kl",
    "clipped_value_loss",
    "gae_advantages",
    "gae_returns",
    "terminal_rewards",
    "value_statistics",
    "cispo_loss",
    "compute_advantages_and_returns",
    "compute_policy_loss",
    "distilled_advantages",
    "generalized_jsd",
    "opsd_token_terms",
    "get_estimator",
    "group_relative_advantages",
    "importance_weights",
    "gspo_loss",
    "masked_population_normalize",
    "masked_whiten",
    "mismatch_sums",
    "opd_metrics",
    "opd_reverse_kl",
    "opsm_keep",
    "ppo_clip_loss",
    "reinforce_plus_plus_baseline_advantages",
    "rejection_keep",
    "reinforce_plus_plus_returns",
    "response_mean",
    "rloo_advantages",
    "rloo_loss",
    "sapo_loss",
    "tis_weights",
    "token_mean",
    "veto_keep",
]
