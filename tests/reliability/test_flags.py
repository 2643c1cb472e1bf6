"""The reliability flags: defaults and one-line rejections (as reinforce_plus_plus.md §8:
exit 2)."""

import pytest

from relax.config import ConfigError, parse_train_config

BASE = ["--num-rollout", "2"]


def test_defaults():
    cfg = parse_train_config(BASE)
    assert (cfg.checkpoint.keep_last, cfg.rollout.rewards.reward_timeout,
            cfg.rollout.rewards.reward_error_policy,
            cfg.run.distributed_timeout_minutes) == (None, 30.0, "raise", 10.0)


@pytest.mark.parametrize("flags,needle", [
    (["--keep-last", "2"], "--keep-last 2: nothing is saved without --save"),
    (["--save", "s", "--keep-last", "0"], "--keep-last 0: must be >= 1"),
    (["--reward-timeout", "0"], "--reward-timeout 0: must lie in (0, 86400]"),
    (["--reward-timeout", "1e9"], "--reward-timeout 1e+09: must lie in (0, 86400]"),
    (["--reward-timeout", "nan"], "--reward-timeout: expected a finite number"),
    (["--reward-error-policy", "ignore"], "--reward-error-policy: invalid choice"),
    (["--distributed-timeout-minutes", "-1"], "--distributed-timeout-minutes -1: must lie in (0, 10080]"),
])
def test_rejections(flags, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        parse_train_config([*BASE, *flags])
    assert str(e.value).startswith(needle), str(e.value)
