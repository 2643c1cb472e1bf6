"""The ``relax train`` flags: Relax/Megatron names, grouped, each help giving default,
meaning and the docs/algorithms/reinforce_plus_plus.md section that fixes it.

The parser only parses and type-checks; every cross-flag rule lives in
:mod:`relax.config.validate`. Its errors (unknown flag, bad number, bad choice) are raised
as :class:`~relax.config.validate.ConfigError` so that the command line prints one line
and exits 2, exactly like a rejected configuration.
"""

from __future__ import annotations

import argparse
import difflib
import math

from relax.config.eval_flags import add_eval_flags
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.validate import DEVICES, ESTIMATOR_NAMES, KL_TYPES, ConfigError
from relax.errors import invalid_text
from relax.rollout.reasoning_gym_source import ANSWER_FORMATS

RM_TYPES: tuple[str, ...] = ("math", *BUILTIN_TASK_NAMES)

DESCRIPTION = (
    "Train a language model with reinforcement learning (synchronous colocate rollout, then "
    "update). Without --hf-checkpoint and --prompt-data it trains the built-in tiny model on a "
    "built-in task with the built-in preset (docs/configuration.md). Rules: reinforce_plus_plus.md §8."
)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    bad = invalid_text(value)
    if bad:
        raise argparse.ArgumentTypeError(bad)
    return value




_METAVARS = {finite_float: "X", integer: "N", text: "STR"}


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors become one-line :class:`ConfigError` s."""

    def error(self, message: str):
        hint = f"see {self.prog} --help"
        if message.startswith("argument "):
            head, _, reason = message[len("argument "):].partition(": ")
            # "-h/--help" style heads: keep the long spelling
            raise ConfigError(head.split("/")[-1], f"{reason}; {hint}")
        raise ConfigError(message, hint)

    def parse_strict(self, argv: list[str]) -> argparse.Namespace:
        """parse_args with a did-you-mean for unknown flags instead of argparse's list."""
        ns, extras = self.parse_known_args(argv)
        if extras:
            token = extras[0]
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                known = [s for a in self._actions for s in a.option_strings]
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]}?" if close else f"see {self.prog} --help"
                raise ConfigError(name, f"unknown flag; {hint}")
            # name the flag the stray value follows, when there is one
            at = len(argv) - 1 - argv[::-1].index(token)
            before = [t for t in argv[:at] if t.startswith("--")]
            if not before:
                raise ConfigError(repr(token), f"unexpected argument; {self.prog} takes only "
                                  f"--flags; see {self.prog} --help")
            raise ConfigError(before[-1].split("=", 1)[0], f"unexpected extra value {token!r}; "
                              f"each flag takes at most one value; see {self.prog} --help")
        return ns


def build_train_parser(prog: str = "relax train", suppress_defaults: bool = False) -> _Parser:
    """The ``relax train`` parser. ``suppress_defaults`` leaves unset flags out of the
    Namespace, which is how :func:`explicit_dests` sees what the user typed."""
    parser = _Parser(prog=prog, description=DESCRIPTION, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)

    def group(title: str, description: str):
        g = parser.add_argument_group(title, description)

        def add(flag: str, help: str, **kw):
            if suppress_defaults:
                kw["default"] = argparse.SUPPRESS
            if "metavar" not in kw and kw.get("type") in _METAVARS:
                kw["metavar"] = _METAVARS[kw["type"]]
            g.add_argument(flag, help=help, **kw)

        def switch(flag: str, help: str, default: bool = False):
            add(flag, help, action="store_true", default=default)

        return add, switch

    add, switch = group("algorithm", "Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7).")
    add("--advantage-estimator", choices=ESTIMATOR_NAMES, default="grpo",
        help="Default grpo. The advantage estimator and with it the policy loss (reinforce_plus_plus.md §3-§5, 7).")
    switch("--normalize-advantages", "Default off. REINFORCE++ variants: global masked "
           "population normalization, required (reinforce_plus_plus.md §6, 8). grpo/gspo/sapo: masked_whiten "
           "(reinforce_plus_plus.md §5).")
    add("--gamma", type=finite_float, default=1.0,
        help="Default 1.0. Discount of the reward-to-go return, in (0, 1]; only "
             "reinforce_plus_plus reads it (reinforce_plus_plus.md §3).")
    add("--kl-coef", type=finite_float, default=0.0,
        help="Default 0. Reward-shaping KL coefficient beta >= 0; only reinforce_plus_plus "
             "(recipe 0.01, reinforce_plus_plus.md §3). Must be 0 for the others (reinforce_plus_plus.md §4, 8).")
    add("--kl-loss-type", choices=KL_TYPES, default="k1",
        help="Default k1. KL estimator (reinforce_plus_plus.md §2): reinforce_plus_plus requires k1 (reward "
             "shaping); reinforce_plus_plus_baseline's --use-kl-loss requires k2 (reinforce_plus_plus.md §8).")
    switch("--use-kl-loss", "Default off. Add the separate reference KL loss (reinforce_plus_plus.md §7); "
           "rejected for reinforce_plus_plus (reinforce_plus_plus.md §8).")
    add("--kl-loss-coef", type=finite_float, default=0.0,
        help="Default 0. Weight of the KL loss, >= 0, needs --use-kl-loss; never nonzero "
             "together with --kl-coef (reinforce_plus_plus.md §7, 8).")
    add("--entropy-coef", type=finite_float, default=0.0,
        help="Default 0. Entropy bonus weight, >= 0: loss -= coef * entropy (reinforce_plus_plus.md §7).")
    add("--eps-clip", type=finite_float, default=0.2,
        help="Default 0.2. Lower PPO clip eps_low, in (0, 1) (reinforce_plus_plus.md §7); not for sapo.")
    add("--eps-clip-high", type=finite_float, default=None,
        help="Default = --eps-clip. Upper PPO clip eps_high > 0 (reinforce_plus_plus.md §7); not for sapo.")
    add("--eps-clip-c", type=finite_float, default=None,
        help="Default off. Dual-clip bound c > 1 for negative advantages (reinforce_plus_plus.md §7); grpo and "
             "the REINFORCE++ variants only.")
    add("--sapo-tau-pos", type=finite_float, default=1.0,
        help="Default 1.0. SAPO gate temperature for A > 0 (reinforce_plus_plus.md §7); sapo only.")
    add("--sapo-tau-neg", type=finite_float, default=1.05,
        help="Default 1.05. SAPO gate temperature for A <= 0 (reinforce_plus_plus.md §7); sapo only.")
    switch("--disable-grpo-std-normalization", "Default off. grpo/gspo/sapo: do not divide "
           "the group-centred reward by the group std (reinforce_plus_plus.md §5).")
    switch("--calculate-per-token-loss", "Default off (response mean). grpo/gspo/sapo: global "
           "token-mean reduction; rejected for the REINFORCE++ variants (reinforce_plus_plus.md §7, 8).")
    add("--custom-advantage-function-path", type=text, default=None,
        help="Default none. 'module:function' or 'file.py:function' replacing the advantage "
             "of grpo/gspo/sapo; rejected for the REINFORCE++ variants (reinforce_plus_plus.md §8).")
    add("--custom-reward-post-process-path", type=text, default=None,
        help="Default none. 'module:function' or 'file.py:function' post-processing rewards; "
             "rejected for reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).")

    add, switch = group("batches", "Sizes in prompts and samples (responses).")
    add("--rollout-batch-size", type=integer, default=8,
        help="Default 8. Prompts per rollout step; a multiple of WORLD_SIZE.")
    add("--n-samples-per-prompt", type=integer, default=1,
        help="Default 1. Responses per prompt (a group); > 1 for "
             "reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).")
    add("--global-batch-size", type=integer, default=None,
        help="Default = rollout samples (one optimizer step per rollout). Samples per "
             "optimizer step; divides the rollout samples, multiple of WORLD_SIZE x "
             "--micro-batch-size (reinforce_plus_plus.md §7: one step's loss).")
    add("--micro-batch-size", type=integer, default=None,
        help="Default = global batch / WORLD_SIZE. Samples per forward/backward per rank.")
    add("--num-steps-per-rollout", type=integer, default=None,
        help="Default = rollout samples / global batch. Optimizer steps per rollout step; "
             "alone it sets the global batch.")
    add("--num-rollout", type=integer, default=None,
        help="Default none. Rollout steps to run; required without --prompt-data.")
    add("--num-epoch", type=integer, default=None,
        help="Default 1. Passes over --prompt-data when --num-rollout is not given.")

    add, switch = group("model and data", "Defaults: the built-in tiny model and task.")
    add("--hf-checkpoint", type=text, default=None,
        help="Default: built-in tiny model. Hugging Face model directory (with config.json).")
    add("--ref-load", type=text, default=None,
        help="Default: the initial policy weights. Reference model directory; only with a KL "
             "(--kl-coef or --use-kl-loss).")
    add("--prompt-data", type=text, default=None,
        help="Default: the built-in task. Prompt file (.jsonl or .parquet; needs --rm-type "
             "or --custom-rm-path), or reasoning-gym:NAME?key=value&... (a reasoning-gym "
             "dataset, scored by its own verifier unless a reward flag is given).")
    add("--reasoning-gym-answer", choices=ANSWER_FORMATS, default="tags",
        help="Default tags (reasoning-gym's <answer> tags and system prompt). How the answer "
             "of a reasoning-gym source is read: tags, last_number or boxed.")
    add("--input-key", type=text, default="input",
        help="Default input. Prompt field of --prompt-data records.")
    add("--label-key", type=text, default="label",
        help="Default label. Label field of --prompt-data records, passed to the reward.")
    switch("--apply-chat-template", "Default off. Wrap prompts in the --hf-checkpoint "
           "tokenizer's chat template.")
    add("--system-prompt", type=text, default=None,
        help="Default none. System message: in the chat template with "
             "--apply-chat-template, else a line before the prompt.")
    switch("--rollout-shuffle", "Default off. Shuffle --prompt-data each epoch (seeded).")
    add("--rollout-max-response-len", type=integer, default=1024,
        help="Default 1024. Maximum generated tokens per response; longer ones are truncated.")
    add("--rollout-temperature", type=finite_float, default=1.0,
        help="Default 1.0. Sampling temperature > 0.")
    add("--rollout-top-p", type=finite_float, default=1.0,
        help="Default 1.0 (off). Nucleus sampling mass in (0, 1].")
    add("--rollout-top-k", type=integer, default=-1,
        help="Default -1 (off). Top-k sampling, >= 1 or -1.")
    add("--rm-type", choices=RM_TYPES, default=None,
        help="Default: the built-in task's reward. Reward for --prompt-data: math "
             "(math-verify answer check) or a built-in task's reward.")
    add("--custom-rm-path", type=text, default=None,
        help="Default none. 'module:function' or 'file.py:function' reward; excludes "
             "--rm-type.")
    add("--builtin-task", choices=BUILTIN_TASK_NAMES, default=BUILTIN_TASK_NAMES[0],
        help=f"Default {BUILTIN_TASK_NAMES[0]} (preset may change it). Built-in task used "
             "without --prompt-data.")

    add, switch = group("optimizer", "AdamW, constant learning rate.")
    add("--lr", type=finite_float, default=1e-6, help="Default 1e-6. Learning rate > 0.")
    add("--weight-decay", type=finite_float, default=0.0, help="Default 0. AdamW weight decay.")
    add("--adam-beta1", type=finite_float, default=0.9, help="Default 0.9. AdamW beta1.")
    add("--adam-beta2", type=finite_float, default=0.999, help="Default 0.999. AdamW beta2.")
    add("--clip-grad", type=finite_float, default=1.0,
        help="Default 1.0. Gradient-norm clip > 0.")
    add("--seed", type=integer, default=1234, help="Default 1234. Seed of every RNG.")

    add, switch = group("modes", "Only synchronous colocate training is implemented (reinforce_plus_plus.md §9).")
    switch("--colocate", "Default on. Rollout then train on the same devices; accepted, "
           "it is the only mode.", default=True)
    switch("--fully-async", "Default off. Rejected: not implemented; for the REINFORCE++ "
           "variants the normalization needs a closed global batch (reinforce_plus_plus.md §8).")
    switch("--hybrid", "Default off. Rejected like --fully-async (reinforce_plus_plus.md §8).")
    add("--context-parallel-size", type=integer, default=1,
        help="Default 1. Values other than 1 are rejected (reinforce_plus_plus.md §8, 9).")
    switch("--fsdp", "Default off (DDP replication). Shard parameters with FSDP2 fully_shard.")
    add("--peak-tflops", type=finite_float, default=None,
        help="Default: measured at start-up (a square matmul in the run's dtype). Peak "
             "TFLOP/s per rank that perf/*_mfu divides by.")
    add("--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="Default: on with CUDA, off on the CPU. Forward passes under bf16 autocast; fp32 "
             "master weights, AdamW state and log-prob math; reference stored in bf16.")
    add("--device", choices=DEVICES, default="auto",
        help="Default auto (cuda when available, else cpu).")

    add, switch = group("evaluation", "Periodic evaluation during training: pass@k (unbiased) "
                        "and mean reward on held-out prompts (docs/configuration.md).")
    add_eval_flags(add, integer=integer, finite_float=finite_float, train=True)

    add, switch = group("run", "Output, checkpoints, logging.")
    add("--output-dir", type=text, default=None,
        help="Default runs/<estimator>-<YYYYmmdd-HHMMSS>. Gets config.json and the metrics.")
    add("--save", type=text, default=None,
        help="Default none (no checkpoints). Checkpoint directory.")
    add("--save-interval", type=integer, default=None,
        help="Default: only at the end. Rollout steps between checkpoints; needs --save.")
    add("--load", type=text, default=None,
        help="Default none. Checkpoint directory to resume from.")
    add("--keep-last", type=integer, default=None,
        help="Default: keep all. Keep only the newest K interval checkpoints; needs --save.")
    add("--reward-timeout", type=finite_float, default=30.0,
        help="Default 30. Seconds per sample a reward function may take (docs/reliability.md).")
    add("--reward-error-policy", choices=("raise", "zero"), default="raise",
        help="Default raise. A reward that raises, times out or is NaN/Inf: stop with an error "
             "naming the sample, or score it 0 and count it in rollout/reward_errors.")
    add("--distributed-timeout-minutes", type=finite_float, default=10.0,
        help="Default 10. Collective timeout: a rank that waits longer for its peers exits "
             "with an error.")
    add("--log-samples", type=integer, default=4,
        help="Default 4. Samples per rollout step appended to OUTPUT_DIR/samples.jsonl "
             "(prompt, response, reward, label); 0 turns it off.")
    switch("--use-tensorboard", "Default off. Also write TensorBoard event files.")
    switch("--use-wandb", "Default off. Also log to Weights & Biases (needs wandb).")
    switch("--dry-run", "Default off. Validate, print the resolved configuration as JSON, "
           "exit 0 without loading a model or data.")
    return parser


def build_eval_parser() -> _Parser:
    """The ``relax eval CHECKPOINT`` parser (same one-line errors as ``relax train``)."""
    from relax.config.eval_flags import build_eval_parser as build

    return build(_Parser, integer=integer, finite_float=finite_float, text=text,
                 choices={"rm_type": RM_TYPES, "builtin_task": BUILTIN_TASK_NAMES,
                          "device": DEVICES, "reasoning_gym_answer": ANSWER_FORMATS})


def explicit_dests(argv: list[str]) -> set[str]:
    """Dests the user passed on the command line (run after a successful full parse)."""
    ns, _ = build_train_parser(suppress_defaults=True).parse_known_args(argv)
    return set(vars(ns))


def train_flags() -> dict[str, argparse.Action]:
    """Long flag name -> action, for docs and tests."""
    # the first long name: --bf16 for the pair --bf16 / --no-bf16
    return {a.option_strings[0]: a for a in build_train_parser()._actions
            if a.option_strings and a.dest != "help"}
