"""Group filters for dynamic sampling (``--dynamic-sampling-filter-path``, DAPO-style).

A filter sees one prompt group after scoring and says whether to train on it::

    def my_filter(rewards: list[float], responses: list[str], label) -> bool

``rewards`` and ``responses`` are the group's ``--n-samples-per-prompt`` samples, ``label`` the
prompt's label. The built-in one is :func:`check_reward_nonzero_std`: a group whose samples all
scored the same has zero advantage under every group-relative estimator (and zero raw advantage
under REINFORCE++-baseline), so it buys no gradient.
"""

from __future__ import annotations

from collections.abc import Callable

from relax.config.constants import BUILTIN_FILTER_NAMES
from relax.errors import RewardError
from relax.plugins import call_plugin, load_function

GroupFilter = Callable[[list[float], list[str], object], bool]
FLAG = "--dynamic-sampling-filter-path"


def check_reward_nonzero_std(rewards: list[float], responses: list[str], label) -> bool:
    """Keep the group when its rewards are not all equal (their std is nonzero)."""
    return max(rewards) != min(rewards)


# the short names --dynamic-sampling-filter-path accepts (BUILTIN_FILTER_NAMES, validated by
# relax/config/) and their functions
BUILTIN_FILTERS: dict[str, GroupFilter] = dict.fromkeys(BUILTIN_FILTER_NAMES,
                                                        check_reward_nonzero_std)


def load_group_filter(spec: str) -> GroupFilter:
    """A built-in filter by short name, else ``module:function`` / ``file.py:function``."""
    return BUILTIN_FILTERS.get(spec) or load_function(spec, FLAG)


def kept_groups(fn: GroupFilter, rewards: list[float], responses: list[str], labels: list,
                n: int, *, timeout: float | None = None) -> list[int]:
    """Indices of the groups (consecutive runs of ``n`` samples) that ``fn`` keeps.

    Anything but a ``bool`` from ``fn``, or a user filter's call past ``timeout`` seconds
    (``--reward-timeout``, per group), is refused in one line naming the flag (a truthy list
    or a NumPy bool would hide a bug)."""
    keep = []
    if fn is check_reward_nonzero_std:
        timeout = None  # Relax's own: no thread needed
    for g in range(len(rewards) // n):
        rows = slice(g * n, (g + 1) * n)
        verdict = call_plugin(fn, FLAG, list(rewards[rows]), list(responses[rows]), labels[g * n],
                              timeout=timeout)
        if not isinstance(verdict, bool):
            kind = type(verdict)  # numpy.bool would read as "bool" unqualified
            name = kind.__name__ if kind.__module__ == "builtins" else \
                f"{kind.__module__}.{kind.__qualname__}"
            raise RewardError(f"{FLAG}: the filter must return True or False for a group, got "
                              f"{name}")
        if verdict:
            keep.append(g)
    return keep
