"""--env environments that misbehave (tests/hostile/hostile_envs.py): whatever reset or step
raises or returns fails its episode with a reason naming the environment (or ends the run in
one line under --reward-error-policy raise); observations never overflow the context; a step
has an optional time limit; a second SIGTERM stops a hung environment
(docs/reliability.md, section 9)."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import torch

from relax import plugins
from relax.errors import InputError, Interrupted
from relax.plugins import MAX_RUNNING
from relax.rollout.agents import env_guard
from relax.rollout.agents.env_guard import (
    EnvFailure,
    GuardedEnv,
    guarded_factory,
    start_environments,
)
from relax.rollout.agents.envs import environment_factory
from relax.rollout.agents.episodes import TurnRenderer, run_episodes
from relax.rollout.generation.generate import generate
from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.signals import GRACE_S
from tests.hostile import hostile_envs
from tests.hostile.helpers import SMALL, env, one_error_line, relax
from tests.reliability.helpers import Child

SPEC = "tests.hostile.hostile_envs"
WHAT = {
    "reset_dict": "the environment's reset returned the observation dict {'observation': 'go'}",
    "reset_none": "the environment's reset returned the observation NoneType None",
    "reset_raises": "the environment's reset raised ValueError: no board for this seed",
    "exit0": "the environment raised SystemExit",
    "keyboard": "the environment raised KeyboardInterrupt",
    "recursion": "the environment raised RecursionError",
    "nan": "the environment's step returned the reward nan",
    "inf": "the environment's step returned the reward -inf",
    "huge": "the environment's step returned the reward -1e+300, beyond the float32 range",
    "pair": "returned tuple ('x', 1.0); expected (observation, reward, done)",
    "surrogate": "an observation that is not valid UTF-8 text",
    "bool_reward": "the reward bool True; expected a real number",
}


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0).eval()


def play(tiny, envs, *, context=256, max_turns=3, stop_at_first_error=False):
    tok, model = tiny
    generator = torch.Generator().manual_seed(0)

    def sample(ids, mask, k, cache=None):
        return generate(model, ids, mask, max_new_tokens=k, eos_token_ids=[tok.eos_token_id],
                        pad_token_id=tok.pad_token_id, generator=generator, cache=cache)

    return run_episodes(envs, list(range(len(envs))), tokenizer=tok,
                        format_prompt=lambda t: t,
                        render=TurnRenderer(tok, chat=False, eos_token_id=tok.eos_token_id),
                        sample=sample, max_turns=max_turns, max_turn_tokens=4, context=context,
                        device="cpu", stop_at_first_error=stop_at_first_error)


@pytest.fixture(autouse=True)
def release_hung():
    yield
    hostile_envs.release_hung()  # abandoned calls return and free their workers
    # ... on their own threads: the next test would find them still busy (and be refused a
    # worker) if it started before they had returned
    deadline = time.monotonic() + 30
    while plugins._POOL.busy and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def trainers_sigint():
    """SIGINT handled as relax train handles it: a KeyboardInterrupt is the user code's own."""
    previous = signal.signal(signal.SIGINT, lambda *a: None)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("kind", hostile_envs.KINDS)
def test_each_misbehaviour_fails_its_episode_with_the_reason(tiny, kind, trainers_sigint):
    played = play(tiny, [hostile_envs.Misbehaving(kind), hostile_envs.Misbehaving("ok")])
    assert played.rewards == [0.0, 1.0]  # the healthy episode next to it is untouched
    (error,) = played.errors
    assert error.startswith("episode 0 (seed 0), ") and WHAT[kind] in error, error
    assert "\n" not in error and len(error) < 400
    assert bool(played.rollout.truncated[0])  # a failed episode is not one the env ended


def test_a_keyboard_interrupt_is_the_stop_when_sigint_is_pythons(tiny, python_sigint):
    # relax eval keeps Python's SIGINT handler: Ctrl-C must stop it, not fail an episode
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        play(tiny, [hostile_envs.Misbehaving("keyboard")])


def test_the_trainers_interrupt_is_never_an_environment_error(tiny):
    class RaisesTheStop(hostile_envs.Misbehaving):
        def step(self, action):  # what the handler of a second SIGTERM raises mid-step
            raise Interrupted(signal.SIGTERM, "stopped at once by a second SIGTERM")

    with pytest.raises(Interrupted):
        play(tiny, [RaisesTheStop("ok")])


def test_an_observation_longer_than_the_room_left_ends_the_episode_truncated(tiny):
    tok = tiny[0]
    assert len(tok("ab " * 400, add_special_tokens=False)["input_ids"]) > 256
    played = play(tiny, [hostile_envs.Misbehaving("long") for _ in range(2)], context=64)
    r = played.rollout
    assert played.errors == [] and played.turns == [1, 1]
    assert r.truncated.all()
    held = r.prompt_mask.sum(-1) + r.context_mask.sum(-1)
    assert (held <= 64).all()  # never more than the context
    assert (r.context_mask == r.response_mask).all()  # the observation was not added


def test_the_step_time_limit_abandons_the_call_and_builds_a_fresh_environment():
    made = []

    def make():
        made.append(hostile_envs.Misbehaving("hang"))
        return made[-1]

    env = GuardedEnv(make(), make, timeout_s=0.3)
    assert env.reset(1) == "go"
    start = time.monotonic()
    with pytest.raises(EnvFailure, match=r"step did not return within --env-step-timeout "
                       r"0.3 s \(abandoned\)"):
        env.step("x")
    assert time.monotonic() - start < 5
    assert env.reset(2) == "go" and len(made) == 2 and env.env is made[1]


class Counted(hostile_envs.Misbehaving):
    steps = 0

    def step(self, action):
        Counted.steps += 1
        return super().step(action)


def test_under_the_raise_policy_the_first_timed_out_step_ends_the_episodes(tiny):
    # before: every episode waited out its own deadline (32 x T here, 128 x T in the probe)
    Counted.steps = 0
    envs = [GuardedEnv(Counted("hang"), timeout_s=0.05) for _ in range(32)]
    with pytest.raises(EnvFailure, match=r"^episode 0 \(seed 0\), turn 1: the environment's "
                       r"step did not return within --env-step-timeout 0.05 s \(abandoned\)$"):
        play(tiny, envs, stop_at_first_error=True)
    assert Counted.steps == 1  # no other step was started


def test_timed_out_calls_do_not_pile_up_threads(tiny):
    # the zero policy plays every episode; each abandoned call keeps its worker
    hostile_envs.release_hung()
    Counted.steps, before = 0, threading.active_count()
    envs = [GuardedEnv(Counted("hang"), timeout_s=0.05) for _ in range(40)]
    played = play(tiny, envs)
    assert len(played.errors) == 40 and played.rewards == [0.0] * 40
    timed_out = [e for e in played.errors if "did not return within" in e]
    refused = [e for e in played.errors if "was not started: " in e]
    assert len(timed_out) + len(refused) == 40 and 1 <= len(timed_out) <= MAX_RUNNING
    assert Counted.steps == len(timed_out)  # a refused call never reached the environment
    assert threading.active_count() - before <= MAX_RUNNING
    assert plugins._POOL.threads <= MAX_RUNNING


def test_a_factory_that_hangs_or_exits_is_one_line_naming_the_environment(monkeypatch):
    name = f"--env {SPEC}:hang_factory"
    with pytest.raises(InputError, match=rf"^{name}: the environment's factory did not return "
                       r"within --env-step-timeout 0.1 s \(abandoned\)$"):
        start_environments(hostile_envs.hang_factory, 2, name=name, timeout_s=0.1)
    # without --env-step-timeout the factory still has a deadline
    monkeypatch.setattr(env_guard, "FACTORY_TIMEOUT_S", 0.1)
    with pytest.raises(InputError, match=r"factory did not return within 0.1 s, the factory's "
                       r"limit without --env-step-timeout \(abandoned\)$"):
        start_environments(hostile_envs.hang_factory, 2, name=name, timeout_s=None)
    # the factory's own limit back: 0.1 s would turn a slow exit on a busy machine into the
    # deadline's message instead of the SystemExit this checks
    monkeypatch.undo()
    with pytest.raises(InputError, match=rf"^--env {SPEC}:exit_factory: the environment's "
                       r"factory raised SystemExit: 3$"):
        environment_factory(f"{SPEC}:exit_factory")
    # built lazily (evaluation), a failing factory fails its episode like a failing reset
    env = guarded_factory(hostile_envs.exit_factory, None)()
    with pytest.raises(EnvFailure, match="the environment's factory raised SystemExit: 3"):
        env.reset(0)


# ------------------------------------------------------------------ real relax processes

@pytest.mark.parametrize("kind", ["exit0", "nan"])
@pytest.mark.subprocess
def test_under_the_raise_policy_the_run_ends_in_one_line_naming_the_environment(tmp_path,
                                                                                kind):
    out = relax("train", *SMALL, "--env", f"{SPEC}:{kind}", "--output-dir", tmp_path / "run")
    assert out.returncode == 1, out.stderr[-2000:]  # SystemExit(0) used to end it with 0
    line = one_error_line(out)
    assert f"--env {SPEC}:{kind}: episode " in line and WHAT[kind] in line
    assert "--lr" not in line and "--reward-error-policy zero" in line


@pytest.mark.subprocess
def test_under_the_zero_policy_every_misbehaviour_is_a_counted_failed_episode(tmp_path):
    out = relax("train", *SMALL, "--env", f"{SPEC}:mixed", "--reward-error-policy", "zero",
                "--output-dir", tmp_path / "run")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/reward_errors"] for r in rows] == [4, 4]
    warnings = [x for x in out.stderr.splitlines() if x.startswith("relax train: warning:")]
    for kind in hostile_envs.KINDS[:8]:  # 2 steps x 4 episodes, one kind each
        (line,) = [x for x in warnings if WHAT[kind] in x]
        assert line.startswith(f"relax train: warning: --env {SPEC}:mixed: episode "), line


@pytest.mark.parametrize("kind", ["hang", "swallow"])
@pytest.mark.subprocess
def test_a_second_sigterm_stops_a_hung_environment_within_seconds(tmp_path, kind):
    mark = tmp_path / "in_step"
    child = Child([*SMALL, "--env", f"{SPEC}:{kind}", "--reward-error-policy", "zero",
                   "--output-dir", str(tmp_path / "run")], env(RELAX_TEST_MARK=str(mark)))
    deadline = time.monotonic() + 90
    while not mark.exists():
        assert child.proc.poll() is None and time.monotonic() < deadline, child.lines[-20:]
        time.sleep(0.05)
    child.proc.send_signal(signal.SIGTERM)
    child.wait_for_line("received SIGTERM")
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    assert child.finish(timeout=GRACE_S + 20) == 128 + signal.SIGTERM
    took = time.monotonic() - sent
    print(f"second SIGTERM to exit ({kind}): {took:.2f} s")
    # a plain hang unwinds on its own; one that swallows the Interrupted is ended by the
    # watchdog, which says so
    assert took < (GRACE_S if kind == "hang" else GRACE_S + 5), took
    (line,) = child.errors()
    assert "stopped at once by a second SIGTERM" in line
    assert ("user code did not return within" in line) == (kind == "swallow"), line
    assert not any("the environment raised" in x for x in child.lines)


@pytest.mark.subprocess
def test_one_sigterm_stops_a_run_whose_environment_factory_hangs(tmp_path):
    mark = tmp_path / "in_factory"
    child = Child([*SMALL, "--env", f"{SPEC}:hang_factory", "--output-dir",
                   str(tmp_path / "run")], env(RELAX_TEST_MARK=str(mark)))
    deadline = time.monotonic() + 90
    while not mark.exists():
        assert child.proc.poll() is None and time.monotonic() < deadline, child.lines[-20:]
        time.sleep(0.05)
    child.proc.send_signal(signal.SIGTERM)  # one: nothing is trained yet, nothing to save
    assert child.finish(timeout=GRACE_S + 20) == 128 + signal.SIGTERM, child.lines[-20:]
    (line,) = child.errors()
    assert line == ("relax train: error: stopped by SIGTERM while building the --env "
                    "environments, before the first rollout step (nothing to save)"), line
    assert not any("Traceback" in x for x in child.lines)


@pytest.mark.subprocess
def test_a_factory_that_exits_or_hangs_past_its_deadline_is_exit_2(tmp_path):
    out = relax("train", *SMALL, "--env", f"{SPEC}:exit_factory", "--output-dir",
                tmp_path / "a")
    assert out.returncode == 2, out.stderr[-2000:]  # before: exit 3 and no message
    assert one_error_line(out) == (f"relax train: error: --env {SPEC}:exit_factory: the "
                                   "environment's factory raised SystemExit: 3")
    out = relax("train", *SMALL, "--env", f"{SPEC}:hang_factory", "--env-step-timeout", "1",
                "--output-dir", tmp_path / "b")
    assert out.returncode == 2, out.stderr[-2000:]
    assert one_error_line(out).endswith(f"--env {SPEC}:hang_factory: the environment's factory "
                                        "did not return within --env-step-timeout 1 s "
                                        "(abandoned)")


@pytest.mark.subprocess
def test_a_run_of_32_hung_episodes_ends_at_the_first_deadline(tmp_path):
    calls = tmp_path / "calls"
    out = relax("train", *SMALL, "--rollout-batch-size", "16", "--env", f"{SPEC}:hang",
                "--env-step-timeout", "1", "--output-dir", tmp_path / "run",
                extra_env={"RELAX_TEST_CALLS": str(calls)})
    assert out.returncode == 1, out.stderr[-2000:]
    line = one_error_line(out)
    assert (f"--env {SPEC}:hang: episode 0 (seed " in line and "turn 1: the environment's step "
            "did not return within --env-step-timeout 1 s (abandoned)" in line), line
    assert calls.read_text().splitlines() == ["step"]  # one deadline, not 32
