"""Built-in tasks: prompts generated in code, each with its verifiable reward side by side.

A task gives ``sample(rng) -> (prompt, label)`` and
``reward(prompts, responses, labels) -> list[float]`` in [0, 1]. Rewards give partial credit
(per-character agreement) so that a small model trained from scratch gets a signal long before
its first exact answer. ``--rm-type <task name>`` scores any data with that task's reward.

- ``copy``:     ``"cab="`` -> ``"cab"``: repeat the string before ``=``.
- ``addition``: ``"12+7="`` -> ``"19"``: the decimal sum.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


def char_agreement(target: str, response: str) -> float:
    """Share of aligned positions where ``response`` agrees with ``target``.

    Divided by the longer of the two, so extra characters cost as much as missing ones;
    1.0 exactly for an exact answer.
    """
    response = response.strip()
    if not target and not response:
        return 1.0
    hits = sum(a == b for a, b in zip(target, response, strict=False))
    return hits / max(len(target), len(response))


@dataclass(frozen=True)
class CopyTask:
    name: str = "copy"
    alphabet: str = "abcd"
    min_len: int = 2
    max_len: int = 4

    def sample(self, rng: random.Random) -> tuple[str, str]:
        s = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        return f"{s}=", s

    def reward(self, prompts: list[str], responses: list[str], labels: list) -> list[float]:
        return [char_agreement(str(y), r) for r, y in zip(responses, labels, strict=True)]


@dataclass(frozen=True)
class AdditionTask:
    name: str = "addition"
    max_operand: int = 20

    def sample(self, rng: random.Random) -> tuple[str, str]:
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return f"{a}+{b}=", str(a + b)

    def reward(self, prompts: list[str], responses: list[str], labels: list) -> list[float]:
        # right-aligned digits: the units digit of "19" is compared with the units digit of "9"
        return [
            char_agreement(str(y)[::-1], r.strip()[::-1])
            for r, y in zip(responses, labels, strict=True)
        ]


TASKS = {t.name: t for t in (CopyTask(), AdditionTask())}


def get_task(name: str):
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown built-in task {name!r}; valid: {', '.join(TASKS)}") from None
