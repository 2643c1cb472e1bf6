"""A scripted environment for the built-in tiny model: a few turns of "say this digit".

Each turn the environment shows one digit; a turn whose reply starts with that digit earns
1 / TURNS, so a perfect episode scores 1. Small enough for the character-level tiny model to
learn in a CPU minute, and an example of the interface ``--env`` expects
(relax/rollout/agents/envs.py): ``reset(seed) -> observation`` and
``step(action) -> (observation, reward, done)``.

    relax train --env examples/envs/digits.py:make_env --num-rollout 30 --max-turns 3
"""

import random

TURNS = 3


class Digits:
    def reset(self, seed: int) -> str:
        self.rng = random.Random(seed)  # its own stream: the game is a function of the seed
        self.turn = 0
        self.target = str(self.rng.randrange(10))
        return self.target

    def step(self, action: str) -> tuple[str, float, bool]:
        reward = 1.0 / TURNS if action[:1] == self.target else 0.0
        self.turn += 1
        self.target = str(self.rng.randrange(10))
        return self.target, reward, self.turn >= TURNS


def make_env():
    return Digits()
