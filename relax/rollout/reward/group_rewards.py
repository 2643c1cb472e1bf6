"""Group rewards: ``--group-rm --custom-rm-path module:function`` scores a whole group.

Relax's and slime's ``--group-rm``: the reward function is called once per prompt with the
group's ``--n-samples-per-prompt`` samples, here as rewards.py's signature over the group,
``function(prompts, responses, labels) -> list[float]`` (every prompt and label of a group are
the same; passing them keeps one signature for both modes), and returns one reward per member,
in order, so it can rank, compare or normalise the responses against each other.

Failures follow rewards.py: a group that raises, runs over ``--reward-timeout`` per sample or
scores NaN/Inf stops the run naming the group (``--reward-error-policy raise``) or scores 0 and
is counted in ``rollout/reward_errors`` (``zero``). Returning anything but one real number per
member is a broken plug-in, not a bad sample: an :class:`InputError` (exit 2) naming
``--group-rm`` whatever the policy, since every later group would fail the same way.
"""

from __future__ import annotations

from relax.errors import InputError, RewardError
from relax.plugins import CallRaised, CallTimeout, bad_reward, call_with_deadline, real_values
from relax.rollout.reward.rewards import RewardFn


def group_spans(group_index: list[int]) -> list[list[int]]:
    """The sample indices of each group, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_index):
        groups.setdefault(int(g), []).append(i)
    return list(groups.values())


def by_prompt_runs(fn: RewardFn, name: str) -> RewardFn:
    """A group function as a plain reward function for evaluation, whose batches hold each
    prompt's samples side by side: ``fn`` is called once per run of equal prompts."""
    def grouped(prompts, responses, labels):
        out, start = [], 0
        while start < len(prompts):
            end = start + 1
            while end < len(prompts) and prompts[end] == prompts[start]:
                end += 1
            args = (prompts[start:end], responses[start:end], labels[start:end])
            out.extend(real_values(fn(*args), end - start, name, f"a group of {end - start}"))
            start = end
        return out

    return grouped


def score_groups(fn: RewardFn, prompts: list[str], responses: list[str], labels: list,
                 group_index: list[int], *, name: str, index_base: int = 0,
                 timeout: float | None = None, policy: str = "raise",
                 ) -> tuple[list[float], list[str]]:
    """Rewards [B] of ``fn`` called once per group, and one message per failed sample (each
    scored 0.0, ``policy="zero"``); ``policy="raise"``: the first failure is a RewardError."""
    values, failures = [0.0] * len(prompts), []
    for members in group_spans(group_index):
        got, message = _score_group(fn, prompts, responses, labels, members, name=name,
                                    index_base=index_base, timeout=timeout)
        if message is not None:
            if policy == "raise":
                raise RewardError(message)
            failures.extend(f"{message} [sample {index_base + i}]" for i in members)
            continue
        for i, v in zip(members, got, strict=True):
            values[i] = v
    return values, failures


def _score_group(fn, prompts, responses, labels, members, *, name, index_base, timeout):
    """``(rewards, None)`` of one group, or ``(None, one-line message)`` when it failed."""
    first, last = index_base + members[0], index_base + members[-1]
    where = f"the group of samples {first}..{last}"
    args = tuple([seq[i] for i in members] for seq in (prompts, responses, labels))
    limit = None if timeout is None else timeout * len(members)
    try:
        got = call_with_deadline(fn, args, limit)
    except CallTimeout as e:
        return None, (f"--group-rm reward function {name} {e.reason()} for {where} "
                      f"(--reward-timeout {timeout:g} s per sample)")
    except CallRaised as raised:
        e = raised.error
        detail = " ".join(str(e).split())[:200]
        return None, (f"--group-rm reward function {name} raised on {where}: "
                      f"{type(e).__name__}{': ' + detail if detail else ''}")
    try:
        got = real_values(got, len(members), name, where)
    except RewardError as e:
        raise InputError(f"--group-rm: {e}; a group function returns one reward per member "
                         f"of the group it is given ({len(members)} here)") from None
    bad = [p for p in map(bad_reward, got) if p is not None]
    if bad:
        return None, f"--group-rm reward function {name} returned {bad[0]} in {where}"
    return got, None
