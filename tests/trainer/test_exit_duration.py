"""``--exit-duration-in-mins``: a wall-clock budget ends the run after a whole step, measured
and saved as if it were the last one, and ``--load`` continues it (docs/configuration.md)."""

import json

import pytest

from relax.config import parse_train_config
from relax.errors import ConfigError
from relax.trainer.state.checkpoint import MARKER
from tests.trainer.helpers import fit, make_config

FLAGS = ["--num-rollout", "3", "--eval-interval", "5"]


def test_a_run_out_of_time_ends_after_a_whole_step_evaluated_saved_and_resumable(tmp_path):
    save = tmp_path / "save"
    # any positive budget is spent by the time step 1 ends
    cfg = make_config(*FLAGS, "--exit-duration-in-mins", "1e-9", "--save", str(save),
                      output_dir=tmp_path / "run")
    trainer, history, _ = fit(cfg)
    assert len(history) == 1
    # the interval (5) does not divide step 1: the evaluation ran because the run ended there
    assert any(k.startswith("eval/") for k in history[0])
    assert trainer.control.ended_early == "stopped by --exit-duration-in-mins 1e-09 after rollout step 1 of 3"
    # the final model of step 1 in DIR, and the checkpoint --load continues from
    assert json.loads((save / MARKER).read_text())["rollout_step"] == 1
    assert (save / "model.safetensors").exists()
    assert (save / "rollout_000001").is_dir() and not (save / "rollout_000002").exists()

    resumed = make_config(*FLAGS, "--load", str(save), "--save", str(save),
                          output_dir=tmp_path / "run")
    trainer, tail, _ = fit(resumed)
    assert trainer.start_step == 1 and len(tail) == 2 and trainer.control.ended_early is None
    # a full run evaluates only where the interval says (never here)
    assert not any(k.startswith("eval/") for row in tail for k in row)


def test_a_budget_that_is_not_spent_changes_nothing(tmp_path):
    cfg = make_config(*FLAGS, "--exit-duration-in-mins", "600", output_dir=tmp_path / "run")
    trainer, history, _ = fit(cfg)
    assert len(history) == 3 and trainer.control.ended_early is None
    assert not any(k.startswith("eval/") for row in history for k in row)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_budget_must_be_positive(value):
    with pytest.raises(ConfigError, match="--exit-duration-in-mins.*must be > 0 minutes"):
        parse_train_config(["--num-rollout", "2", "--exit-duration-in-mins", value])
