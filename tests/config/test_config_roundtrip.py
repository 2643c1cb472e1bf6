"""A run's config.json, given back with ``--config``, reproduces exactly its configuration
(docs/configuration.md, "Configuration files"): every preset, estimator and mode that validates
without loading a model is resolved, written the way ``relax train`` writes it
(:func:`relax.config.write_config`), fed back and compared field for field."""

from __future__ import annotations

import sys

import pytest

from relax.config import parse_train_config, write_config
from relax.config.section import to_flat
from relax.estimators import ESTIMATOR_NAMES

# each a command line (HF: a model directory, DATA: a prompt file, KEYED: one with a
# privileged-information key, DIR: a fresh directory), with its WORLD_SIZE
_ESTIMATOR_FLAGS = {
    "reinforce_plus_plus": ["--normalize-advantages", "--kl-coef", "0.01"],
    "reinforce_plus_plus_baseline": ["--normalize-advantages", "--use-kl-loss",
                                     "--kl-loss-type", "k2", "--kl-loss-coef", "0.01"],
    "rloo": ["--calculate-per-token-loss"],
    "cispo": ["--calculate-per-token-loss", "--eps-clip-high", "10", "--use-tis"],
    "ppo": ["--lambd", "0.95", "--value-clip", "0.3", "--critic-lr", "1e-5",
            "--num-critic-only-steps", "2", "--num-rollout", "5", "--critic-save", "DIR"],
}
RUNS: dict[str, tuple[int, list[str]]] = {
    **{f"preset-{name}": (1, ["--advantage-estimator", name, *_ESTIMATOR_FLAGS.get(name, [])])
       for name in ESTIMATOR_NAMES},
    "preset-bare": (1, []),
    # a flag equal to its default while the preset sets another value
    "preset-lr-at-default": (1, ["--lr", "1e-6"]),
    "preset-batch-at-default": (1, ["--rollout-batch-size", "8"]),
    "preset-steps": (1, ["--num-steps-per-rollout", "4", "--micro-batch-size", "2"]),
    "data-math": (1, ["--hf-checkpoint", "HF", "--prompt-data", "DATA", "--rm-type", "math",
                      "--n-samples-per-prompt", "4", "--num-epoch", "2", "--rollout-shuffle",
                      "--eval-interval", "2", "--eval-prompt-data", "dev", "DATA",
                      "--eval-temperature", "0"]),
    "data-rollout-length": (1, ["--prompt-data", "DATA", "--rm-type", "math",
                                "--num-rollout", "3", "--rollout-temperature", "0.7"]),
    "world-4": (4, ["--rollout-batch-size", "8", "--global-batch-size", "32"]),
    "fully-async": (3, ["--fully-async", "--use-tis", "--rollout-batch-size", "4",
                        "--max-staleness", "2", "--update-weights-interval", "2"]),
    "fully-async-exact": (2, ["--fully-async", "--max-staleness", "0"]),
    "lora": (1, ["--lora-rank", "4", "--lora-alpha", "8", "--lora-target-modules", "q_proj",
                 "v_proj"]),
    "dynamic-sampling": (1, ["--dynamic-sampling-filter-path", "nonzero_std",
                             "--over-sampling-batch-size", "32",
                             "--dynamic-sampling-max-rounds", "3"]),
    "partial": (1, ["--partial-rollout", "--use-tis", "--over-sampling-batch-size", "32"]),
    "off-policy": (1, ["--use-tis", "--tis-clip", "3", "--use-opsm"]),
    "rollout-logprobs": (1, ["--use-rollout-logprobs", "--get-mismatch-metrics"]),
    "token-budget": (1, ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "64"]),
    "opd": (1, ["--use-opd", "--opd-teacher-load", "HF", "--opd-kl-coef", "0.5"]),
    "opd-only": (1, ["--use-opd", "--opd-only", "--opd-teacher-load", "HF"]),
    "opd-self": (1, ["--prompt-data", "KEYED", "--rm-type", "math", "--use-opd",
                     "--opd-type", "self", "--opsd-privileged-info-key", "solution",
                     "--num-rollout", "2"]),
    "opd-fully-async": (2, ["--use-opd", "--opd-teacher-load", "HF", "--fully-async",
                            "--use-tis"]),
    "env": (1, ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "2",
                "--eval-interval", "2", "--eval-episodes", "4"]),
    "agents": (1, ["--use-agentic-rollout", "--agent-command", f"{sys.executable} -c pass"]),
    "checkpoints": (1, ["--save", "DIR", "--save-interval", "2", "--keep-last", "2",
                        "--async-save", "--checkpoint-checksums"]),
    "eval-builtin": (1, ["--eval-interval", "5", "--n-samples-per-eval-prompt", "4",
                         "--eval-max-response-len", "3"]),
    "kl-loss": (1, ["--use-kl-loss", "--kl-loss-type", "k3", "--kl-loss-coef", "0.001",
                    "--entropy-coef", "0.01", "--eps-clip", "0.1", "--eps-clip-c", "3"]),
    "sapo-taus": (1, ["--advantage-estimator", "sapo", "--sapo-tau-pos", "0.9",
                      "--sapo-tau-neg", "1.1", "--disable-grpo-std-normalization"]),
    "run-settings": (1, ["--seed", "7", "--log-samples", "0", "--exit-duration-in-mins", "30",
                         "--distributed-timeout-minutes", "5", "--weight-decay", "0.01",
                         "--clip-grad", "0.5", "--system-prompt", "Be brief."]),
}


def _fill(argv: list[str], tmp_path, hf_dir: str, prompt_file: str) -> list[str]:
    keyed = tmp_path / "keyed.jsonl"
    keyed.write_text('{"input": "1+1=", "label": "2", "solution": "2"}\n')
    names = {"HF": hf_dir, "DATA": prompt_file, "KEYED": str(keyed)}
    out = []
    for i, token in enumerate(argv):
        out.append(str(tmp_path / f"dir{i}") if token == "DIR" else names.get(token, token))
    return out


@pytest.mark.parametrize("world, argv", RUNS.values(), ids=RUNS.keys())
def test_config_json_given_back_is_the_same_configuration(world, argv, tmp_path, hf_dir,
                                                          prompt_file):
    environ = {"WORLD_SIZE": str(world)}
    argv = _fill(argv, tmp_path, hf_dir, prompt_file)
    cfg = parse_train_config([*argv, "--output-dir", str(tmp_path / "run")], environ=environ)
    saved = write_config(cfg)
    again = parse_train_config(["--config", saved], environ=environ)
    first, second = to_flat(cfg), to_flat(again)
    assert {k: v for k, v in second.items() if first[k] != v} == {}
    assert again == cfg
