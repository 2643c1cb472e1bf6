"""Scripted in-process environments for the episode tests (``--env tests.rollout.agents.scripted:...``).

Every environment records what it was given in module-level lists, so a test can compare
the trainer's view of an episode with the environment's."""

import os
import random

ACTIONS: list[tuple[int, str]] = []  # (seed, action text) in the order step() saw them
REWARDS: list[float] = []  # the episode reward each episode earned, in end order
TURNS = 3


class Countdown:
    """Shows 'T-k' for k = TURNS..1; a turn's reward is a function of the seed and the action's
    length, so rewards vary between the samples of a group. Reseeds Python's global random on
    reset, like gem and textarena."""

    reseed_global = True

    def reset(self, seed: int) -> str:
        if self.reseed_global:
            random.seed(0)
            random.random()
        self.seed, self.left, self.total, self.actions = seed, TURNS, 0.0, []
        return f"go{seed % 7}"

    def step(self, action: str):
        ACTIONS.append((self.seed, action))
        self.actions.append(action)
        reward = ((self.seed % 5) + len(action)) / 10.0
        self.total += reward
        self.left -= 1
        if self.left == 0:
            REWARDS.append(self.total)
        return f"T-{self.left}", reward, self.left == 0


class QuietCountdown(Countdown):
    reseed_global = False


class Broken(Countdown):
    """Raises on the second turn of every episode whose seed is odd."""

    def step(self, action: str):
        if self.seed % 2 and self.left == TURNS - 1:
            raise RuntimeError("the game server went away")
        return super().step(action)


class RankBroken(Countdown):
    """Raises on rank 1 only (a data-parallel failure)."""

    def step(self, action: str):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1's environment failed")
        return super().step(action)


class Ragged(Countdown):
    """Episodes of 1 to TURNS turns, by seed: a step's episodes end at different turns."""

    def reset(self, seed: int) -> str:
        text = super().reset(seed)
        self.left = 1 + seed % TURNS
        return text


class Drifting(Ragged):
    """Numbers its observations by the instance that made them: a rebuilt environment
    answers the same seed and actions differently."""

    built = 0

    def __init__(self):
        Drifting.built += 1
        self.instance = Drifting.built

    def step(self, action: str):
        observation, reward, done = super().step(action)
        return f"{observation}#{self.instance}", reward, done


def countdown():
    return Countdown()


def ragged():
    return Ragged()


def drifting():
    return Drifting()


def quiet_countdown():
    return QuietCountdown()


def broken():
    return Broken()


def rank_broken():
    return RankBroken()


def no_step():
    return object()


JUDGED: list[int] = []  # the seeds Judge.reset saw


class Judge:
    """One turn; the reward depends on the seed only (1.0 when seed % 3 == 0, else 0.25), so
    the evaluation's metrics can be computed by hand from the seeds."""

    def reset(self, seed: int) -> str:
        JUDGED.append(seed)
        self.seed = seed
        return f"go{seed % 7}"

    def step(self, action: str):
        return "", 1.0 if self.seed % 3 == 0 else 0.25, True


def judge():
    return Judge()
