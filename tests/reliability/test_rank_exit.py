"""How a rank of a multi-process run ends (docs/reliability.md section 4): through
``exit_rank``, which skips the interpreter's finalization (where Gloo's worker threads can
abort the process) but keeps what a user relies on at exit: the status, flushed output and,
unless a peer failed, ``atexit`` handlers."""

import os
import subprocess
import sys

import pytest

from tests.reliability.helpers import SMALL, finish_all, read_rows, start_ranks

pytestmark = pytest.mark.subprocess  # every test here starts `relax` processes (conftest.py)

EXIT_SCRIPT = """
import atexit, sys
from relax.trainer.distributed import exit_rank
atexit.register(lambda: print("handler ran", flush=True))
print("unflushed", end="")  # stdout is a pipe: block-buffered, lost without the flush
sys.stderr.write("err unflushed")
exit_rank(3, run_exit_handlers={handlers})
"""


def _exit(handlers: bool) -> subprocess.CompletedProcess:
    code = EXIT_SCRIPT.format(handlers=handlers)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_exit_rank_keeps_status_output_and_exit_handlers():
    done = _exit(handlers=True)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushedhandler ran\n"
    assert done.stderr.endswith("err unflushed")


def test_exit_rank_after_a_peer_failure_skips_exit_handlers():
    done = _exit(handlers=False)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushed"


REWARD_WITH_EXIT_HANDLER = '''
import atexit, os

def _bye():
    with open(os.path.join(os.environ["RELAX_TEST_DIR"], "bye_" + os.environ["RANK"]), "w") as f:
        f.write("closed")

atexit.register(_bye)

def reward(prompts, responses, labels):
    return [len(r) % 2 for r in responses]
'''


def test_two_rank_run_exits_0_after_its_summary_and_runs_exit_handlers(tmp_path):
    reward = tmp_path / "reward_bye.py"
    reward.write_text(REWARD_WITH_EXIT_HANDLER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RELAX_TEST_DIR": str(tmp_path)}
    ranks = start_ranks([*SMALL, "--custom-rm-path", f"{reward}:reward", "--num-rollout", "2",
                         "--output-dir", str(tmp_path / "run")], env)
    assert finish_all(ranks) == [0, 0], ranks[0].lines[-20:] + ranks[1].lines[-20:]
    assert any("relax train: 2 rollout steps in" in x for x in ranks[0].lines)
    assert [row["rollout/step"] for row in read_rows(tmp_path / "run")] == [1, 2]
    for rank in (0, 1):  # the custom reward module's clean-up ran on both ranks
        assert (tmp_path / f"bye_{rank}").read_text() == "closed"
