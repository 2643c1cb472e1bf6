"""``--fully-async`` (relax/trainer/fully_async/async_layout.py): rollout ranks sample while training ranks
train, under one torchrun, with a fixed lag. Real Gloo processes, bounded waits.

- K = 0 gives the colocated loop's numbers (one training rank; two training ranks with DDP
  and FSDP2 served by one rollout rank; LoRA, which sends only the adapter);
- K = 1 trains on batches one step old, repeats exactly, and --load continues exactly with the
  batch in flight taken from the checkpoint, also from the final checkpoint (as the colocated
  loop does); --load with another K or I continues the schedule from the checkpoint's step;
- ranks launched with different settings stop at once, each with one line naming the flag;
- a rollout rank that fails, hangs or is killed ends the run with one line naming it and its
  role; SIGTERM drains both sides; two simulated nodes on localhost train like one machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from relax.errors import RelaxError
from relax.ports import PortReservation
from relax.trainer.fully_async import weight_sync
from relax.trainer.fully_async.async_layout import Schedule
from relax.trainer.fully_async.remote_rollout import served_version
from relax.trainer.state import sharded_state
from tests.distributed_utils import torchrun_relax
from tests.reliability.helpers import finish_all, kill_left, start_ranks
from tests.trainer.helpers import RECIPES, read_metrics, write_reward

pytestmark = pytest.mark.subprocess  # torchrun throughout (conftest.py)

STEPS = ["--num-rollout", "4", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
         "--rollout-max-response-len", "6", "--micro-batch-size", "4", "--rollout-temperature",
         "1.5", "--lr", "1e-2", "--device", "cpu", "--log-samples", "0", "--seed", "5"]
# what must agree between runs: everything but wall times, memory and the async timings
SKIP = ("perf/", "async/rollout_", "async/train_", "async/weight_sync_time")
LAG = ["--fully-async", "--max-staleness", "1", "--use-tis"]
# Two runs that three tests read and none writes: the K = 1 run of STEPS and a K = 1 checkpoint
# of step 2. Each test started the same torchrun for them (two ranks, ~20 s on a busy 2-core
# machine); the group keeps the tests on one xdist worker, so each run starts once.
SHARED = pytest.mark.xdist_group("fully-async-lag-one")


def _run(tmp_path, name, *flags, nproc, timeout=240, stderr=None):
    reward = write_reward(tmp_path)
    out = tmp_path / name
    proc = torchrun_relax(*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:parity",
                          *flags, "--output-dir", str(out), nproc=nproc, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    return read_metrics(out) if (out / "metrics.jsonl").exists() else []


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The directory of the shared runs and of the runs that continue them: one reward file,
    so a resumed run's --custom-rm-path is the checkpoint's, as in a test's own tmp_path."""
    return tmp_path_factory.mktemp("fully-async-shared")


@pytest.fixture(scope="module")
def lag_one(shared):
    """The metrics of the K = 1 run of STEPS (4 steps, one training and one rollout rank),
    launched as two simulated nodes on localhost (test_two_simulated_nodes_on_localhost):
    the tests that continue it under one torchrun then also check that two nodes train like
    one machine, and the two-node layout costs no launch of its own."""
    out = shared / "lag-one"
    flags = [*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{write_reward(shared)}:parity",
             *LAG, "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
             "--rollout-num-gpus", "1", "--output-dir", str(out)]
    reservation = PortReservation()
    nodes = [subprocess.Popen(
        [*two_nodes(n, reservation.port), "-m", "relax", "train", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}) for n in (0, 1)]
    try:
        results = [node.communicate(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
        reservation.release()
    assert [node.returncode for node in nodes] == [0, 0], results[0][1][-3000:]
    return read_metrics(out)


@pytest.fixture(scope="module")
def lag_one_checkpoint(shared):
    """``--save`` of the K = 1 run cut to 2 steps: the final checkpoint, which holds the batch
    of step 3 (sampled with the weights after step 2). Tests only ``--load`` it."""
    save = shared / "lag-one-ckpt"
    _run(shared, "lag-one-part", *LAG, "--num-rollout", "2", "--save", str(save), nproc=2)
    return save


COLOCATED = pytest.mark.xdist_group("fully-async-colocated")


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    """The metrics of the colocated run of STEPS with --eval-interval 2 (one rank): the K = 0
    run's reference, and the uninterrupted run that the colocated run continued from its final
    checkpoint must repeat (evaluation draws from no generator of training's: the same
    training numbers, which that comparison checks). Two tests read it; the group keeps them
    on one xdist worker, so it runs once."""
    return _run(tmp_path_factory.mktemp("fully-async-colocated"), "colocated", "--eval-interval",
                "2", nproc=1)


def _same(got, want, *, keys=None, skip=()):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key in keys or [k for k in w if not k.startswith((*SKIP, *skip)) and k in g]:
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-9), (g["rollout/step"], key)


def test_the_schedule_is_a_fixed_lag():
    s = Schedule(staleness=2, interval=1, total_steps=6)
    assert [s.version(n) for n in range(6)] == [0, 0, 0, 1, 2, 3]
    assert s.needed(0) == [0, 1, 2, 3] and s.needed(4) == [2, 3]
    assert list(s.in_flight(3)) == [3, 4]  # sampled with weights 1 and 2, older than 3
    every_2 = Schedule(staleness=1, interval=2, total_steps=7)
    assert [every_2.version(n) for n in range(7)] == [0, 0, 0, 2, 2, 4, 4]
    assert list(every_2.in_flight(3)) == [3, 4]  # version 2 < 3: the checkpoint cannot redo them
    assert list(Schedule(0, 1, 4).in_flight(2)) == []  # K = 0: nothing in flight
    assert s.end == 6 and list(s.in_flight(6)) == []  # without --save nothing after the end


def test_the_staleness_counts_the_version_the_vllm_servers_reported():
    """A batch's version is the oldest its servers reported (else the rollout rank's, as for
    Relax's engine); one further behind than the lag allows names the server, in one line."""
    s = Schedule(staleness=1, interval=2, total_steps=8)  # lags up to 1 + 2 - 1 = 2
    assert served_version(5, {"version": 4}, s) == 4
    assert served_version(5, {"version": 4, "served": None}, s) == 4
    assert served_version(5, {"version": 4, "served": (3, "http://a:1")}, s) == 3
    with pytest.raises(RelaxError) as e:
        served_version(5, {"version": 4, "served": (2, "http://b:2")}, s)
    line = str(e.value)
    assert "\n" not in line and "vLLM server http://b:2" in line and "version 2" in line
    assert "--max-staleness 1 --update-weights-interval 2 allow (2)" in line, line


def test_the_final_checkpoint_carries_the_batches_in_flight_after_the_last_step():
    # K = 2: steps 6 and 7 of a longer run are sampled with weights 4 and 5, older than 6
    s = Schedule(staleness=2, interval=1, total_steps=6, carry=True)
    assert s.end == 8 and list(s.in_flight(6)) == [6, 7] and s.needed(4) == [2, 3, 4, 5]
    assert Schedule(0, 1, 4, carry=True).end == 4  # K = 0: nothing in flight at the end
    assert Schedule(1, 2, 5, carry=True).end == 7  # I = 2: steps 5 and 6 take weights 4


def test_a_resumed_schedule_never_asks_for_weights_older_than_the_checkpoint():
    # a checkpoint of step 2 written with K = 1 holds step 2's batch, sampled with weights 1
    stored = {2: 1}
    larger, kept = Schedule(2, 1, 5).resumed(2, stored)
    assert kept == 1 and [larger.version(n) for n in range(3, 5)] == [2, 2]
    assert larger.needed(3) == [2]  # published at the start: the rollout rank never waits
    smaller, kept = Schedule(0, 1, 4).resumed(2, stored)
    assert kept == 0 and [smaller.version(n) for n in range(2, 4)] == [2, 3]  # lag 1 > 0
    wider, kept = Schedule(1, 2, 6).resumed(2, stored)  # the lag allows up to 1 + 2 - 1
    assert kept == 1 and [wider.version(n) for n in range(3, 6)] == [2, 2, 4]
    same, kept = Schedule(1, 1, 4).resumed(2, stored)
    assert kept == 1 and [same.version(n) for n in range(3, 4)] == [2]  # unchanged: exact


@COLOCATED
def test_staleness_zero_is_the_colocated_run_and_lora_sends_the_adapter(tmp_path, colocated):
    # evaluation runs on the training rank with the newest weights: the same numbers too
    lagless = _run(tmp_path, "async", "--eval-interval", "2", "--fully-async",
                   "--max-staleness", "0", nproc=2)
    _same(lagless, colocated)
    assert "eval/copy/mean_reward" in lagless[1]
    assert all(r["async/staleness"] == 0 for r in lagless)
    assert all(r["async/weight_sync_bytes"] > 0 for r in lagless[:-1])  # every step's weights
    assert lagless[-1]["async/weight_sync_bytes"] == 0  # nothing samples after the last step
    assert max(r["train/grad_norm"] for r in lagless) > 0  # the weights did move

    lora = ["--lora-rank", "4", "--lora-alpha", "8"]
    adapter = _run(tmp_path, "lora", *lora, "--fully-async", "--max-staleness", "0", nproc=2)
    assert 0 < adapter[0]["async/weight_sync_bytes"] < lagless[0]["async/weight_sync_bytes"] / 5


def test_a_bf16_rollout_rank_samples_as_the_colocated_bf16_sampler(tmp_path):
    """--rollout-bf16 under --fully-async (relax/precision.py ``use_rollout_bf16``): the
    rollout rank decodes under bf16 autocast while the training rank stays fp32, as the
    colocated run's engine does: the same numbers, and a mismatch of bf16's size."""
    short = ("--rollout-bf16", "--num-rollout", "2")
    colocated = _run(tmp_path, "colocated", *short, nproc=1)
    lagless = _run(tmp_path, "async", *short, "--fully-async", "--max-staleness", "0", nproc=2)
    _same(lagless, colocated)
    assert all(r["rollout/logprob_abs_diff"] > 1e-4 for r in lagless)  # fp32 on both: ~1e-7


def test_two_fsdp_training_ranks_served_by_one_rollout_rank(tmp_path):
    colocated = _run(tmp_path, "colocated", "--fsdp", nproc=2)
    # small buckets: every sync streams many, each gathered from both training ranks' shards
    lagless = _run(tmp_path, "async", "--fsdp", "--fully-async", "--max-staleness", "0",
                   "--weight-sync-bucket-mb", "0.05", nproc=3)
    # colocated FSDP2 decodes with the sharded module (gathered per layer, ranks in
    # lockstep): the same tokens, sampler log-probs that differ in the last bits (~1e-7)
    _same(lagless, colocated, skip=("rollout/logprob_abs_diff", "rollout/mismatch_"))


@SHARED
def test_lag_one_trains_on_older_samples_and_resumes_exactly(tmp_path, lag_one):
    lag, first = LAG, lag_one
    assert [r["async/staleness"] for r in first] == [0, 1, 1, 1]
    # step 1 samples with the weights it trains; later steps with the previous step's, which
    # the trainer's log-probs and the TIS weights see
    assert first[0]["rollout/mismatch_k3"] < 1e-9
    assert all(r["rollout/mismatch_k3"] > 1e-6 for r in first[1:])

    # stop after step 1 (a wall-clock budget that is already spent): batch 2 is in flight
    save = tmp_path / "ckpt"
    cut = _run(tmp_path, "resumed", *lag, "--save", str(save), "--exit-duration-in-mins",
               "1e-6", nproc=2)
    _same(cut, first[:1])  # one torchrun's step 1 is the two nodes' (``lag_one``)
    _, state = sharded_state.read_rank_file(str(save / "rollout_000001"), 0)
    assert sorted(state["pending"]) == [1], "the checkpoint holds the batch in flight"
    tail = _run(tmp_path, "resumed", *lag, "--load", str(save), nproc=2)
    _same(tail[1:], first[1:])  # the same seed repeats, and --load continues, exactly


def test_async_save_writes_on_the_training_ranks_and_resumes_exactly(tmp_path):
    """--async-save: two training ranks write the interval checkpoint on their background
    thread through a Gloo group of their own, which the rollout rank created with them; the
    run continued from it is the uninterrupted run (the one that wrote it: one launch fewer
    than a second run to write it)."""
    lag = ["--fully-async", "--max-staleness", "1", "--use-tis", "--num-rollout", "3"]
    save = tmp_path / "save"
    whole = _run(tmp_path, "whole", *lag, "--save", str(save), "--save-interval", "1",
                 "--async-save", nproc=3)
    step_1 = save / "rollout_000001"  # the final save is synchronous: resume step 1's
    _, state = sharded_state.read_rank_file(str(step_1), 1)
    assert sorted(state["pending"]) == [1], "the checkpoint holds the batch in flight"
    tail = _run(tmp_path, "tail", *lag, "--load", str(step_1), nproc=3)
    assert [r["rollout/step"] for r in tail] == [2, 3]
    _same(tail, whole[1:], skip=("async/weight_sync_bytes",))


@pytest.mark.parametrize("mode", [pytest.param("colocated", marks=COLOCATED),
                                  pytest.param("async", marks=SHARED)])
def test_a_run_continued_from_its_final_checkpoint_is_the_uninterrupted_run(tmp_path, mode,
                                                                          request):
    if mode == "async":  # the module's K = 1 runs: the whole one and the one cut to 2 steps
        lag, nproc, where = LAG, 2, request.getfixturevalue("shared")
        whole = request.getfixturevalue("lag_one")
        save = request.getfixturevalue("lag_one_checkpoint")
        # what step 3 trains on: sampled with the weights after step 2
        _, state = sharded_state.read_rank_file(str(save / "rollout_000002"), 0)
        assert sorted(state["pending"]) == [2] and state["pending"][2]["version"] == 1
    else:
        lag, nproc, where = [], 1, tmp_path
        whole = request.getfixturevalue("colocated")  # with evaluation: see the fixture
        save = tmp_path / "save"
        _run(tmp_path, "part", "--num-rollout", "2", "--save", str(save), nproc=nproc)
    tail = _run(where, "continued-tail", *lag, "--load", str(save), nproc=nproc)
    assert [r["rollout/step"] for r in tail] == [3, 4]
    # (a resumed run's first step also counts the checkpoint's weights, sent once at start:
    # the rollout ranks begin with the initial ones)
    _same(tail, whole[2:], skip=("async/weight_sync_bytes",))
    if mode == "async":
        _stop_before_the_first_step(where, [*lag, "--load", str(save)])


def _stop_before_the_first_step(tmp_path, flags):
    """SIGTERM as the resumed run starts: the rollout rank, waiting for its start before
    anything else, is started and stopped (it waited --distributed-timeout-minutes before)."""
    reward = write_reward(tmp_path)
    ranks = start_ranks([*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:parity",
                         *flags, "--output-dir", str(tmp_path / "continued-stopped")],
                        {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        ranks[0].wait_for_line("resuming from", timeout=120)
        for rank in ranks:  # as torchrun forwards it
            rank.proc.send_signal(signal.SIGTERM)
        assert finish_all(ranks, timeout=120) == [128 + signal.SIGTERM] * 2
    finally:
        kill_left(ranks)


@SHARED
def test_resume_with_another_staleness_or_interval_continues_the_schedule(shared,
                                                                         lag_one_checkpoint):
    """From a K = 1 checkpoint of step 2 (holding step 3's batch, sampled with weights 1):
    versions are the new schedule's, never older than the checkpoint's weights (2)."""
    tis, load = ["--fully-async", "--use-tis"], ["--load", str(lag_one_checkpoint)]

    def staleness(name, *flags, steps, stderr=None):
        rows = _run(shared, f"other-{name}", *tis, *load, *flags, "--num-rollout", str(steps),
                    "--distributed-timeout-minutes", "1", nproc=2, stderr=stderr)
        assert [r["rollout/step"] for r in rows] == list(range(3, steps + 1))
        return rows, [r["async/staleness"] for r in rows]

    # larger K: the stored batch (lag 1) trains, then weights 2, 2 until the lag reaches 2
    assert staleness("k2", "--max-staleness", "2", steps=5)[1] == [1, 1, 2]
    # another interval: the lag may reach K + I - 1 = 2; weights 2, 2, 2, 4
    assert staleness("i2", "--max-staleness", "1", "--update-weights-interval", "2",
                     steps=6)[1] == [1, 1, 2, 1]
    # smaller K: the stored batch is sampled again with the checkpoint's weights, which makes
    # K = 0 the colocated loop continued from the same checkpoint
    said = []
    lagless, lags = staleness("k0", "--max-staleness", "0", steps=4, stderr=said)
    assert lags == [0, 0] and ("step 3's was sampled 1 steps behind, more than --max-staleness "
                               "0 --update-weights-interval 1 allow (0)") in said[0]
    colocated = _run(shared, "other-colocated", "--use-tis", *load, "--num-rollout", "4",
                     nproc=1)
    _same(lagless, colocated)
    # a batch of another size is not this run's either (it trained with a traceback before)
    assert staleness("bs", "--max-staleness", "1", "--rollout-batch-size", "1", steps=4,
                     stderr=said)[1] == [0, 1]
    assert "step 3's has 8 rows per training rank, this run's have 4" in said[1]
    # nothing left to train: the rollout rank is started with nothing to sample and stopped
    assert staleness("none", "--max-staleness", "1", steps=2)[1] == []


def two_nodes(node_rank: int, port: int) -> list[str]:
    """torchrun as agent ``node_rank`` of two on 127.0.0.1, one rank each; agent 0 hosts the
    rendezvous at ``port``, which the test holds reserved until both agents are done (a port
    released before agent 0 binds it may be taken meanwhile)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--node_rank", str(node_rank), "--nproc_per_node", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port)]


@pytest.mark.parametrize("differ", ["staleness", "model"])
def test_ranks_launched_with_different_settings_stop_at_once_with_one_line(tmp_path, differ):
    """Two torchrun agents (nodes) with different flags: a deadlock would wait
    --distributed-timeout-minutes (10 min); each rank says why at once, exit 2."""
    reward, reservation = write_reward(tmp_path), PortReservation()
    flags = [*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:parity",
             "--fully-async", "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1",
             "--rollout-num-gpus", "1", "--use-tis", "--output-dir", str(tmp_path / "run")]
    per_node = {  # node 0 trains, node 1 samples
        "staleness": (["--max-staleness", "1"], ["--max-staleness", "2"]),
        # not a setting compared up front: the rollout rank's trainable tensors differ
        "model": (["--lora-rank", "4", "--lora-target-modules", "q_proj"],
                  ["--lora-rank", "4", "--lora-target-modules", "v_proj", "q_proj"])}[differ]
    nodes = [subprocess.Popen(
        [*two_nodes(n, reservation.port), "-m", "relax", "train", *flags, *per_node[n]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}) for n in (0, 1)]
    try:
        errs = [node.communicate(timeout=120)[1] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
        reservation.release()
    why = {"staleness": "the ranks of this job were launched with different --max-staleness: "
                        "1 on rank 0; 2 on rank 1; launch every node with the same flags",
           "model": "rollout rank 1 builds another model than the training ranks (4 trainable "
                    "tensors on the training ranks, 8 here); give every node the same "
                    "--hf-checkpoint and LoRA flags"}[differ]
    for rank, err in enumerate(errs):
        role = "training" if rank == 0 else "rollout"
        (line,) = [x for x in err.splitlines() if x.startswith("relax train: error:")]
        assert line == f"relax train: error: [rank {rank} {role}] {why}", line
        assert "exitcode  : 2" in err


def test_a_rollout_rank_with_another_model_is_named_before_any_weights_travel():
    mine, theirs = [((4, 2), "torch.float32")], [((4, 3), "torch.float32")]
    assert weight_sync.signature_difference(mine, mine) is None
    assert weight_sync.signature_difference(mine, theirs) == (
        "trainable tensor 0 is [4, 3] torch.float32 on the training ranks, [4, 2] "
        "torch.float32 here")
    assert weight_sync.signature_difference(mine, theirs * 2).startswith("2 trainable tensors")


def test_a_failing_rollout_rank_is_named_with_its_role(tmp_path):
    reward = write_reward(tmp_path, "import os\ncalls = []\ndef f(p, r, l):\n"
                          "    calls.append(1)\n"
                          "    if len(calls) == 2:\n"
                          "        raise RuntimeError('reward service down')\n"
                          "    return [0.5] * len(p)\n", name="failing.py")
    proc = torchrun_relax(*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:f",
                          "--fully-async", "--max-staleness", "0", "--output-dir",
                          str(tmp_path / "run"), timeout=120,
                          hang="a training rank kept waiting after the rollout rank failed")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("relax train: error:")]
    assert any("[rank 1 rollout] reward function" in x and "reward service down" in x
               for x in lines), lines
    assert any("[rank 0 training]" in x and "rollout rank 1" in x for x in lines), lines


def test_sigterm_drains_both_sides_with_the_batch_in_flight_saved(tmp_path):
    reward, save = write_reward(tmp_path), tmp_path / "save"
    flags = [*RECIPES["grpo"], *STEPS, "--num-rollout", "500", "--custom-rm-path",
             f"{reward}:parity", "--fully-async", "--max-staleness", "1", "--use-tis",
             "--save", str(save), "--output-dir", str(tmp_path / "run")]
    ranks = start_ranks(flags, {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        ranks[0].wait_for_line("step 2/500", timeout=120)
        for rank in ranks:  # as torchrun forwards it
            rank.proc.send_signal(signal.SIGTERM)
        assert finish_all(ranks, timeout=120) == [128 + signal.SIGTERM] * 2
    finally:
        kill_left(ranks)
    (trainer,) = ranks[0].errors()
    assert "[rank 0 training] stopped by SIGTERM after rollout step" in trainer
    step = int(trainer.split("after rollout step ")[1].split()[0])
    (rollout,) = ranks[1].errors()
    assert "[rank 1 rollout] stopped by SIGTERM once the training ranks had saved" in rollout
    _, state = sharded_state.read_rank_file(str(save / f"rollout_{step:06d}"), 0)
    assert sorted(state["pending"]) == [step]  # the batch sampled for the next step


def test_a_hung_rollout_rank_ends_the_run_within_the_timeout(tmp_path):
    reward = write_reward(tmp_path, "import time\ncalls = []\ndef f(p, r, l):\n"
                          "    calls.append(1)\n"
                          "    if len(calls) == 2:\n"
                          "        time.sleep(600)\n"
                          "    return [0.5] * len(p)\n", name="hanging.py")
    flags = [*RECIPES["grpo"], *STEPS, "--custom-rm-path", f"{reward}:f", "--fully-async",
             "--max-staleness", "0", "--distributed-timeout-minutes", "0.1",
             "--output-dir", str(tmp_path / "run")]
    ranks = start_ranks(flags, {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        assert ranks[0].finish(timeout=120) == 1  # 6 s after the batch was due
    finally:
        kill_left(ranks)  # the rollout rank still sleeps in its reward function
    (line,) = ranks[0].errors()
    assert "[rank 0 training] waiting for step 2's batch: rollout rank 1" in line, line


@SHARED
def test_two_simulated_nodes_on_localhost(lag_one):
    """The README's two-node layout in miniature: node 0 trains, node 1 samples, each its own
    torchrun agent meeting at 127.0.0.1. ``lag_one`` is that run: the tests that continue it
    under one torchrun compare their steps with it exactly."""
    assert [r["async/staleness"] for r in lag_one] == [0, 1, 1, 1]


def test_a_killed_rollout_rank_is_named(tmp_path):
    reward = write_reward(tmp_path)
    flags = [*RECIPES["grpo"], *STEPS, "--num-rollout", "500", "--custom-rm-path",
             f"{reward}:parity", "--fully-async", "--max-staleness", "0",
             "--output-dir", str(tmp_path / "run")]
    ranks = start_ranks(flags, {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        ranks[0].wait_for_line("step 2/500", timeout=120)
        ranks[1].proc.kill()  # SIGKILL: no message of its own, sockets closed by the kernel
        assert ranks[0].finish(timeout=60) == 1
    finally:
        kill_left(ranks)
    (line,) = ranks[0].errors()
    assert "[rank 0 training]" in line and "rollout rank 1" in line, line


def test_ppo_with_staleness_zero_is_the_colocated_run_and_lag_one_resumes_exactly(tmp_path):
    # the critic lives on the training rank: its values, targets and steps are those of the
    # colocated loop on the batch the rollout rank sent; with K = 1 its state is in the
    # checkpoint beside the batch in flight, and --load continues exactly
    ppo = ["--advantage-estimator", "ppo", "--lambd", "0.9", "--critic-lr", "1e-3"]
    colocated = _run(tmp_path, "colocated", *ppo, nproc=1)
    lagless = _run(tmp_path, "async", *ppo, "--fully-async", "--max-staleness", "0", nproc=2)
    _same(lagless, colocated)
    assert all("critic/value_loss" in r and "critic/explained_variance" in r for r in lagless)
    assert lagless[-1]["critic/values_mean"] != lagless[0]["critic/values_mean"]

    # from the checkpoint of step 1 that the uninterrupted run wrote on its way (a run cut
    # there writes the same: test_lag_one_trains_on_older_samples_and_resumes_exactly). The
    # tail saves too: with --save the last step also sends the weights that sample the batch
    # its final checkpoint carries, which async/weight_sync_bytes counts
    lag = [*ppo, "--fully-async", "--max-staleness", "1", "--use-tis"]
    save = tmp_path / "ckpt"
    first = _run(tmp_path, "first", *lag, "--save", str(save), "--save-interval", "1", nproc=2)
    tail = _run(tmp_path, "resumed", *lag, "--save", str(tmp_path / "ckpt-tail"), "--load",
                str(save / "rollout_000001"), nproc=2)
    assert [r["rollout/step"] for r in tail] == [2, 3, 4]
    _same(tail, first[1:])
