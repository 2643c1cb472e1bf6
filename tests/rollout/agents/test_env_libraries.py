"""gem and textarena behind the --env interface, played by a scripted policy. Both come with
`make install` (the ``agents`` extra and gem-llm, Makefile); offline, so only games that need
no downloaded data (textarena's word games fetch nltk corpora on first use)."""

import random
import re

import pytest

from relax.errors import InputError
from relax.rollout.agents.envs import environment_factory


def _binary_search(env, seed: int, fmt: str, low: int, high: int):
    """Play a guessing game to the end; returns (observations, rewards, done)."""
    observations, rewards = [env.reset(seed)], []
    for _ in range(20):
        guess = (low + high) // 2
        observation, reward, done = env.step(fmt.format(guess))
        observations.append(observation)
        rewards.append(reward)
        if done:
            return observations, rewards, done
        if re.search(r"higher", observation):
            low = guess + 1
        else:
            high = guess - 1
    return observations, rewards, False


def test_gem_guess_the_number():
    env = environment_factory("gem:game:GuessTheNumber-v0-easy")()
    observations, rewards, done = _binary_search(env, 3, "\\boxed{{{}}}", 1, 10)
    assert "Guess The Number" in observations[0] and done
    assert sum(rewards) > 0  # binary search over 1-10 wins within 4 turns
    # a reply without \boxed{} ends the episode with gem's format penalty
    env.reset(3)
    _, reward, done = env.step("no idea")
    assert done and reward < 0


def test_textarena_guess_the_number():
    env = environment_factory("textarena:GuessTheNumber-v0-raw")()
    observations, rewards, done = _binary_search(env, 5, "[{}]", 1, 20)
    assert "Guess The Number" in observations[0] and done
    assert rewards[:-1] == [0.0] * (len(rewards) - 1) and rewards[-1] == 1.0  # terminal only
    # the player's own action is not echoed back as an observation
    assert "[10]" not in observations[1]


def test_a_library_episode_is_a_function_of_its_seed():
    env = environment_factory("gem:game:GuessTheNumber-v0-easy")()
    state = random.getstate()
    first = env.reset(7)
    env.step("\\boxed{5}")
    second = env.reset(7)
    assert first == second  # a function of the seed
    random.setstate(state)


@pytest.mark.parametrize("spec,lib", [("gem:game:NoSuchGame-v0", "gem"),
                                      ("textarena:NoSuchGame-v0", "textarena")])
def test_an_unknown_environment_id_is_bad_input(spec, lib):
    with pytest.raises(InputError, match=rf"--env {spec}: {lib} cannot make it .*give an "
                       rf"environment id that {lib} registers"):
        environment_factory(spec)
