"""Every rollout mode under ``--fully-async``: the rollout ranks build the colocated loop's
collector (relax/rollout/assembly.py), so dynamic sampling, partial rollouts, ``--env``
episodes and agent programs keep the fixed-lag promise. Real Gloo processes, bounded waits.

For each mode: ``--max-staleness 0`` gives the colocated run's numbers, and with ``K = 1`` a
run continued with ``--load`` from the checkpoint of its first step (the batch in flight and
the rollout side's state, e.g. the carried groups, from the checkpoint) repeats the
uninterrupted run exactly. That checkpoint is the one the uninterrupted run wrote
(``--save-interval 1``), not a second run's cut short: one launch fewer per mode, and a run
stopped mid-way writes the same checkpoint (test_fully_async.py cuts and resumes one).
Dynamic sampling runs two training ranks on one rollout rank, whose two shares
agree on every round (relax/agreement.py), and on two rollout ranks, which agree over
their own group: the same batches. Partial rollouts of ``--env`` episodes carry episodes (with
their environments) between steps, and the checkpoint holds them. The agent programs think for
a random time before each call (tests/rollout/agents/agent_program.py ``think``), different in every
run: the endpoint's batches wait for every running agent (relax/rollout/agents/agent_server.py),
so they, and every token, repeat anyway.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relax.trainer.state import sharded_state
from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, read_metrics, write_reward

pytestmark = pytest.mark.subprocess

STEPS = ["--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "6", "--micro-batch-size", "2", "--rollout-temperature",
         "1.5", "--lr", "1e-2", "--device", "cpu", "--log-samples", "0", "--seed", "5"]
# what must agree between runs: everything but wall times, memory and the async timings
SKIP = ("perf/", "async/", "rollout/generate_", "rollout/reward_time")
# the parity of the response's length: groups of two often tie, so rounds are filtered
COARSE = "def f(p, r, l):\n    return [float(len(x) % 2) for x in r]\n"
AGENT = Path(__file__).parents[2] / "rollout" / "agents" / "agent_program.py"

MODES = {
    "dynamic-sampling": (["--dynamic-sampling-filter-path", "nonzero_std",
                          "--over-sampling-batch-size", "4", "--dynamic-sampling-max-rounds",
                          "3"], 2),
    "partial": (["--partial-rollout", "--over-sampling-batch-size", "4",
                 "--rollout-max-response-len", "12", "--use-tis"], 1),
    "env": (["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3"], 1),
    "partial-env": (["--partial-rollout", "--over-sampling-batch-size", "4", "--use-tis",
                     "--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3"], 1),
    "agents": (["--use-agentic-rollout", "--agent-command", f"{sys.executable} {AGENT} think",
                "--max-turns", "3"], 1),
}


def _run(tmp_path, name, mode, *flags, nproc):
    reward = write_reward(tmp_path, COARSE, name="coarse.py")
    scored = [] if mode in ("env", "partial-env", "agents") else [
        "--custom-rm-path", f"{reward}:f"]
    out = tmp_path / name
    proc = torchrun_relax(*RECIPES["grpo"], *STEPS, *scored, *MODES[mode][0], *flags,
                          "--output-dir", str(out), nproc=nproc, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return read_metrics(out)


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key in [k for k in w if not k.startswith(SKIP)]:
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), (g["rollout/step"], key)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_rollout_mode_under_fully_async_keeps_the_fixed_lag_promise(tmp_path, mode):
    trainers = MODES[mode][1]
    colocated = _run(tmp_path, "colocated", mode, nproc=trainers)
    lagless = _run(tmp_path, "lagless", mode, "--fully-async", "--max-staleness", "0",
                   nproc=trainers + 1)
    _same(lagless, colocated)
    assert all(r["async/staleness"] == 0 for r in lagless)
    if mode == "dynamic-sampling":  # a share short after a round made both sample another
        assert max(r["rollout/sampling_rounds"] for r in lagless) > 1
        # one rollout rank per training rank: the rounds agreed over the rollout ranks' group
        spread = _run(tmp_path, "spread", mode, "--fully-async", "--max-staleness", "0",
                      "--rollout-num-gpus", "2", nproc=4)
        _same(spread, colocated)
    if mode in ("partial", "partial-env"):
        assert max(r["rollout/partial_carried_groups"] for r in lagless) > 0

    lag = ["--fully-async", "--max-staleness", "1", "--use-tis"]
    # the uninterrupted run writes the checkpoint of its first step on the way; a second run
    # cut there by --exit-duration-in-mins wrote the same (test_fully_async.py's lag-one and
    # PPO tests cut runs that way and check it)
    save = tmp_path / "ckpt"
    first = _run(tmp_path, "first", mode, *lag, "--save", str(save), "--save-interval", "1",
                 nproc=trainers + 1)
    assert [r["async/staleness"] for r in first] == [0, 1, 1]
    cut = save / "rollout_000001"
    _, state = sharded_state.read_rank_file(str(cut), 0)
    assert sorted(state["pending"]) == [1], "the checkpoint holds the batch in flight"
    if mode in ("partial", "partial-env"):  # the rollout side's carried groups travel with it
        assert "carried" in state["rollout"]
    if mode == "partial-env":  # episodes cut between turns: the resume replays their envs
        assert any(e["live"] and e["turns"] > 0 for g in state["rollout"]["carried"] for e in g)
    tail = _run(tmp_path, "tail", mode, *lag, "--load", str(cut), nproc=trainers + 1)
    assert [r["rollout/step"] for r in tail] == [2, 3]
    _same(tail, first[1:])


def test_a_share_that_fails_stops_its_rollout_rank_with_its_own_line(tmp_path):
    """Two training ranks' shares on one rollout rank: the reward fails on the second call
    (whichever share makes it), the other share raises with it instead of waiting at their
    next agreement, and the rollout rank's line is the failure itself."""
    reward = write_reward(tmp_path, "calls = []\ndef f(p, r, l):\n    calls.append(1)\n"
                          "    if len(calls) == 2:\n"
                          "        raise RuntimeError('reward service down')\n"
                          "    return [0.5] * len(p)\n", name="failing.py")
    proc = torchrun_relax(*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:f",
                          "--fully-async", "--max-staleness", "0", "--output-dir",
                          str(tmp_path / "run"), nproc=3, timeout=120,
                          hang="a share or a training rank kept waiting after a share failed")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("relax train: error:")]
    assert any(x.startswith("relax train: error: [rank 2 rollout] reward function")
               and "reward service down" in x for x in lines), lines
    for rank in (0, 1):
        assert any(f"[rank {rank} training]" in x and "rollout rank 2" in x for x in lines), lines

