"""gem's GuessTheNumber games with the reply's last number as the move.

gem reads a move only from ``\\boxed{...}`` and ends the episode with -0.1 otherwise.
SmolLM2-135M-Instruct answers these games with a bare number ("4", "10") and never writes the
box, so under gem's own parser every episode ends at turn 1 with the same reward and no
group has a gradient. This wrapper passes the reply's last integer to gem as ``\\boxed{N}``
(as ``--reasoning-gym-answer last_number`` does for reasoning-gym); a reply without a number
is passed unchanged, so gem's format penalty still applies. The game, its hints and its
rewards are gem's (1 for a win, partial credit ``1 - distance / range`` at the turn limit).

    relax train --env examples/envs/gem_last_number.py:guess_the_number_easy --max-turns 4 ...
    relax eval DIR --env examples/envs/gem_last_number.py:guess_the_number_easy --max-turns 4 ...

Needs gem-llm: ``make install`` in a clone of Relax (the ``agents`` extra, then
``pip install --no-deps gem-llm==0.1.0``; the Makefile says why).
"""

import re

from relax.rollout.agents.envs import GemEnv

NUMBER = re.compile(r"-?\d+")


class LastNumber(GemEnv):
    def step(self, action: str):
        if "\\boxed{" not in action:
            numbers = NUMBER.findall(action)
            if numbers:
                action = f"\\boxed{{{numbers[-1]}}}"
        return super().step(action)


def guess_the_number_easy():
    import gem

    return LastNumber(gem.make("game:GuessTheNumber-v0-easy"))
