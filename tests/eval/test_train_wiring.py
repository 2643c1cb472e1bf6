"""relax train --eval-interval logs eval/<name>/... rows: the trainer calls maybe_evaluate.

The hook lives in relax.eval; the trainer (relax/trainer/loop.py) owns the call.
"""

from __future__ import annotations

import json

from relax.config import parse_train_config


def test_eval_metrics_reach_metrics_jsonl(tmp_path):
    from relax.trainer.launch import run

    cfg = parse_train_config([
        "--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--eval-interval", "2", "--n-samples-per-eval-prompt", "2",
        "--eval-max-response-len", "3", "--device", "cpu", "--output-dir", str(tmp_path)])
    history = run(cfg, console=False)
    assert "eval/copy/pass@1" not in history[0]  # step 1: not due
    assert {"eval/copy/pass@1", "eval/copy/pass@2", "eval/copy/mean_reward"} <= set(history[1])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/step"] == 2 and 0 <= rows[-1]["eval/copy/pass@1"] <= 1
