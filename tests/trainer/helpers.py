"""Small configurations for trainer tests: ``make_config(*flags, **overrides)``."""

from __future__ import annotations

import json
import os
import textwrap

from relax.config import parse_train_config, replace_flat
from relax.trainer.distributed import init_distributed, unwrap
from relax.trainer.loop import Trainer

TINY = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "4"]

RECIPES = {
    "reinforce_plus_plus": ["--advantage-estimator", "reinforce_plus_plus",
                            "--normalize-advantages", "--gamma", "1.0", "--kl-coef", "0.01",
                            "--kl-loss-type", "k1"],
    "reinforce_plus_plus_baseline": ["--advantage-estimator", "reinforce_plus_plus_baseline",
                                     "--normalize-advantages", "--kl-coef", "0",
                                     "--use-kl-loss", "--kl-loss-type", "k2",
                                     "--kl-loss-coef", "0.01"],
    "grpo": ["--advantage-estimator", "grpo"],
    "gspo": ["--advantage-estimator", "gspo"],
    "sapo": ["--advantage-estimator", "sapo"],
    "cispo": ["--advantage-estimator", "cispo", "--calculate-per-token-loss"],
    "rloo": ["--advantage-estimator", "rloo", "--calculate-per-token-loss"],
    "ppo": ["--advantage-estimator", "ppo", "--gamma", "0.99", "--lambd", "0.95"],
}

# A reward that varies between samples of any model: the share of odd character codes.
PARITY_REWARD = textwrap.dedent('''
    def parity(prompts, responses, labels):
        return [sum(ord(c) % 2 for c in r) / max(1, len(r)) for r in responses]
''')


def make_config(*flags, output_dir, tiny=True, **overrides):
    """``parse_train_config`` on the flags (tiny sizes first, so later flags win), then plain
    attribute overrides for values the command line would reject (to test the trainer's own
    checks)."""
    cfg = parse_train_config([*(TINY if tiny else []), "--output-dir", str(output_dir), "--device",
                              "cpu", *flags])
    return replace_flat(cfg, **overrides)


def write_reward(tmp_path, body=PARITY_REWARD, name="rewards.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def write_jsonl(tmp_path, rows, name="data.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def read_metrics(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def fit(cfg):
    """Train ``cfg`` in this process: ``(trainer, history, moved)``, ``moved`` the largest
    absolute change of any parameter (0.0 when no update happened)."""
    trainer = Trainer(cfg, init_distributed(cfg.system.device), console=False)
    initial = {n: p.detach().clone() for n, p in unwrap(trainer.policy.model).named_parameters()}
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    moved = max((p.detach() - initial[n]).abs().max().item()
                for n, p in unwrap(trainer.policy.model).named_parameters())
    return trainer, history, moved
