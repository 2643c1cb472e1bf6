"""Evaluation flags: shared by ``relax train`` (periodic evaluation) and ``relax eval``.

    relax train ... --eval-interval 10 --eval-prompt-data gsm8k data/gsm8k/test.jsonl
    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math

``--eval-prompt-data`` takes ``PATH`` (the set is named after the file stem) or
``NAME PATH [NAME PATH ...]`` (Relax/slime convention); the resolved value is a list of
``[name, path]`` pairs, and every metric is ``eval/<name>/...``. Without it, a run on the
built-in task evaluates on :data:`BUILTIN_EVAL_PROMPTS` fixed prompts of that task.

The sampling flags default to the rollout's (``--eval-temperature`` None -> resolved to
``--rollout-temperature`` and so on); ``--eval-temperature 0`` is greedy decoding. A sample
passes when its reward is >= ``--eval-pass-threshold`` (1.0: an exact answer for the math
reward and the built-in tasks). Like every flag, an evaluation flag that would have no effect
is rejected rather than ignored. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import re
from argparse import Namespace

from relax.config.presets import BUILTIN_PRESET
from relax.config.validate import ConfigError, check_gym_answer, check_gym_spec
from relax.rollout.reasoning_gym_source import PREFIX as GYM_PREFIX
from relax.rollout.reasoning_gym_source import is_reasoning_gym

# Fixed held-out prompts drawn per built-in task when no --eval-prompt-data is given.
BUILTIN_EVAL_PROMPTS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

# dest -> (predicate, what it must be); None means "follow the rollout value".
EVAL_RANGES = {
    "eval_interval": (lambda v: v is None or v >= 1, "must be >= 1 rollout steps"),
    "n_samples_per_eval_prompt": (lambda v: v >= 1, "must be >= 1 responses per prompt"),
    "eval_temperature": (lambda v: v is None or v >= 0.0,
                         "must be >= 0 (0 is greedy decoding)"),
    "eval_top_p": (lambda v: v is None or 0.0 < v <= 1.0,
                   "must lie in (0, 1]; use 1.0 to turn it off"),
    "eval_top_k": (lambda v: v is None or v == -1 or v >= 1,
                   "must be >= 1, or -1 to turn top-k off"),
    "eval_max_response_len": (lambda v: v is None or v >= 1, "must be >= 1 tokens"),
    "eval_batch_size": (lambda v: v >= 1, "must be >= 1 sequences per generation call"),
}
# the dests that only matter when an evaluation runs (train: --eval-interval)
EVAL_DESTS = ("eval_prompt_data", *EVAL_RANGES, "eval_pass_threshold")
# eval sampling dest -> the rollout dest it follows in ``relax train``, and the ``relax
# eval`` fallback (that command has no rollout flags)
FOLLOWS = {
    "eval_temperature": ("rollout_temperature", 1.0),
    "eval_top_p": ("rollout_top_p", 1.0),
    "eval_top_k": ("rollout_top_k", -1),
    "eval_max_response_len": ("rollout_max_response_len", 1024),
}


def add_eval_flags(add, *, integer, finite_float, train: bool) -> None:
    """Register the evaluation flags through a group's ``add(flag, help, **kw)``."""
    follow = "Default: the rollout's value (" if train else "Default "
    if train:
        add("--eval-interval", type=integer, default=None,
            help="Default none (no evaluation). Evaluate every N rollout steps and log "
                 "eval/<name>/pass@k and eval/<name>/mean_reward.")
    add("--eval-prompt-data", nargs="+", default=None, metavar="[NAME] PATH",
        help="Default: the built-in task's fixed evaluation prompts. PATH, or NAME PATH pairs, of .jsonl/.parquet prompt files; fields "
             "--input-key / --label-key, scored with the run's reward.")
    add("--n-samples-per-eval-prompt", type=integer, default=1,
        help="Default 1. Responses per evaluation prompt; pass@k is logged for k = 1, 2, "
             "4, ... up to this number.")
    add("--eval-temperature", type=finite_float, default=None,
        help=(follow + "--rollout-temperature). " if train else follow + "1.0. ") +
             "Sampling temperature >= 0; 0 is greedy.")
    add("--eval-top-p", type=finite_float, default=None,
        help=(follow + "--rollout-top-p). " if train else follow + "1.0. ") +
             "Nucleus sampling mass in (0, 1].")
    add("--eval-top-k", type=integer, default=None,
        help=(follow + "--rollout-top-k). " if train else follow + "-1 (off). ") +
             "Top-k sampling, >= 1 or -1.")
    add("--eval-max-response-len", type=integer, default=None,
        help=(follow + "--rollout-max-response-len). " if train else follow + "1024; the "
              "preset's for the built-in task. ") +
             "Maximum generated tokens per evaluation response.")
    add("--eval-batch-size", type=integer, default=64,
        help="Default 64. Sequences (prompts x samples) per generation call.")
    add("--eval-pass-threshold", type=finite_float, default=1.0,
        help="Default 1.0. A response passes (counts for pass@k) when its reward is >= this.")


def _head(flag: str, value) -> str:
    if isinstance(value, list):
        return f"{flag} {' '.join(map(str, value))}"
    return flag if isinstance(value, bool) else f"{flag} {value:g}" if isinstance(
        value, float) else f"{flag} {value}"


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _reject(ns: Namespace, dest: str, reason: str):
    raise ConfigError(_head(_flag(dest), getattr(ns, dest)), reason)


def eval_pairs(ns: Namespace) -> list[list[str]] | None:
    """``--eval-prompt-data`` tokens -> ``[[name, path], ...]``; the files must exist."""
    tokens = ns.eval_prompt_data
    if tokens is None:
        return None
    if len(tokens) == 1:
        stem = (tokens[0][len(GYM_PREFIX):].partition("?")[0] if is_reasoning_gym(tokens[0])
                else os.path.splitext(os.path.basename(tokens[0].rstrip("/")))[0])
        pairs = [[re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "eval", tokens[0]]]
    elif len(tokens) % 2:
        _reject(ns, "eval_prompt_data", f"got {len(tokens)} values; give one PATH or "
                "NAME PATH pairs, e.g. --eval-prompt-data gsm8k data/gsm8k/test.jsonl")
    else:
        pairs = [list(tokens[i:i + 2]) for i in range(0, len(tokens), 2)]
    seen = set()
    for name, path in pairs:
        if not _NAME.match(name):
            _reject(ns, "eval_prompt_data", f"name {name!r} must use only letters, digits, "
                    "'_', '.' and '-' (it becomes the metric name eval/<name>/...)")
        if name in seen:
            _reject(ns, "eval_prompt_data", f"name {name!r} given twice; names must differ")
        seen.add(name)
        if is_reasoning_gym(path):
            check_gym_spec(path, f"--eval-prompt-data {name}", role="eval")
        elif not os.path.isfile(path):
            _reject(ns, "eval_prompt_data", f"{path}: no such file; give a .jsonl or .parquet "
                    "prompt file, or reasoning-gym:NAME")
    return pairs


def check_ranges(ns: Namespace) -> None:
    for dest, (ok, what) in EVAL_RANGES.items():
        if dest in vars(ns) and not ok(getattr(ns, dest)):
            _reject(ns, dest, what)


def resolve_train_eval(ns: Namespace, explicit: set[str]) -> None:
    """Evaluation rules of ``relax train`` (called by ``resolve_and_validate``)."""
    check_ranges(ns)
    if ns.eval_interval is None:
        for dest in EVAL_DESTS:
            if dest in explicit and dest != "eval_interval":
                _reject(ns, dest, "has no effect without --eval-interval N (evaluation only "
                        "runs every N rollout steps); add --eval-interval or remove it")
    ns.eval_prompt_data = eval_pairs(ns)
    if ns.eval_interval is not None and ns.eval_prompt_data is None and ns.prompt_data:
        raise ConfigError(_head("--eval-interval", ns.eval_interval), "with --prompt-data "
                          "the evaluation set must be given; add --eval-prompt-data NAME PATH")
    if (ns.eval_prompt_data and is_reasoning_gym(ns.prompt_data) and ns.rm_type is None
            and ns.custom_rm_path is None):
        files = [p for _, p in ns.eval_prompt_data if not is_reasoning_gym(p)]
        if files:
            raise ConfigError(f"--eval-prompt-data {files[0]}", "a data file needs a reward, "
                              "and the reasoning-gym verifier only scores reasoning-gym sets; "
                              "evaluate on reasoning-gym:NAME or add --custom-rm-path")
    for dest, (rollout_dest, _) in FOLLOWS.items():
        if getattr(ns, dest) is None:
            setattr(ns, dest, getattr(ns, rollout_dest))


def resolve_eval_command(ns: Namespace, explicit: set[str]) -> Namespace:
    """Rules of ``relax eval CHECKPOINT`` (no training flags, nothing heavy imported)."""
    from relax.config.validate import _check_custom_path

    check_ranges(ns)
    ckpt = ns.checkpoint
    if not os.path.isdir(ckpt):
        raise ConfigError(ckpt, "no such directory; give a checkpoint written by relax train "
                          "--save (or any Hugging Face model directory)")
    if not os.path.isfile(os.path.join(ckpt, "config.json")):
        raise ConfigError(ckpt, "no config.json in it; give the --save directory of a run or "
                          "one of its rollout_NNNNNN subdirectories")
    ns.eval_prompt_data = eval_pairs(ns)
    _check_custom_path(ns, "custom_rm_path")
    if ns.rm_type is not None and ns.custom_rm_path is not None:
        raise ConfigError(f"--rm-type {ns.rm_type} --custom-rm-path {ns.custom_rm_path}",
                          "two reward functions; keep one")
    if ns.eval_prompt_data is None:
        if ns.rm_type is not None and ns.rm_type != ns.builtin_task:
            _reject(ns, "rm_type", f"the built-in task {ns.builtin_task!r} brings its own "
                    "reward; remove --rm-type or give --eval-prompt-data")
        for dest, default in (("input_key", "input"), ("label_key", "label")):
            if getattr(ns, dest) != default:
                _reject(ns, dest, "only applies to --eval-prompt-data; remove it")
    else:
        if "builtin_task" in explicit:
            _reject(ns, "builtin_task", "is only used without --eval-prompt-data; remove one "
                    "of them")
        files = [p for _, p in ns.eval_prompt_data if not is_reasoning_gym(p)]
        if files and ns.rm_type is None and ns.custom_rm_path is None:
            raise ConfigError(f"--eval-prompt-data {files[0]}", "needs a reward; add --rm-type "
                              "math or --custom-rm-path module:function")
        ns.builtin_task = None
    check_gym_answer(ns, explicit, [p for _, p in ns.eval_prompt_data or ()])
    for dest, (rollout_dest, fallback) in FOLLOWS.items():
        if getattr(ns, dest) is None:
            if ns.builtin_task is not None:  # the built-in model is trained with the preset
                fallback = BUILTIN_PRESET.get(rollout_dest, fallback)
            setattr(ns, dest, fallback)
    if ns.output_dir is not None and os.path.exists(ns.output_dir) and not os.path.isdir(
            ns.output_dir):
        _reject(ns, "output_dir", "exists and is not a directory; choose another path")
    return ns


def build_eval_parser(parser_cls, *, integer, finite_float, text, choices) -> argparse.ArgumentParser:
    """The ``relax eval`` parser (``parser_cls`` is the train parser's one-line-error class)."""
    parser = parser_cls(
        prog="relax eval", allow_abbrev=False,
        description="Evaluate a saved checkpoint: sample --n-samples-per-eval-prompt responses "
                    "per prompt, score them with the reward, print eval/<name>/pass@k and "
                    "eval/<name>/mean_reward as JSON (docs/configuration.md).")
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="A --save directory of relax train (or a rollout_NNNNNN "
                             "subdirectory, or any Hugging Face causal LM directory).")
    g = parser.add_argument_group("evaluation")

    def add(flag, help, **kw):
        g.add_argument(flag, help=help, **kw)

    add_eval_flags(add, integer=integer, finite_float=finite_float, train=False)
    add("--input-key", type=text, default="input", help="Default input. Prompt field.")
    add("--label-key", type=text, default="label", help="Default label. Label field.")
    add("--rm-type", choices=choices["rm_type"], default=None,
        help="Default: the built-in task's reward. Reward for --eval-prompt-data.")
    add("--custom-rm-path", type=text, default=None,
        help="Default none. 'module:function' or 'file.py:function' reward.")
    add("--apply-chat-template", action="store_true",
        help="Default off. Wrap prompts in the checkpoint tokenizer's chat template.")
    add("--system-prompt", type=text, default=None, help="Default none. System message.")
    add("--reasoning-gym-answer", choices=choices["reasoning_gym_answer"], default="tags",
        help="Default tags. How the answer of a reasoning-gym set is read: tags, "
             "last_number or boxed.")
    add("--builtin-task", choices=choices["builtin_task"], default=choices["builtin_task"][0],
        help="Default copy. Built-in task evaluated without --eval-prompt-data.")
    add("--seed", type=integer, default=1234, help="Default 1234. Sampling seed.")
    add("--bf16", action=argparse.BooleanOptionalAction, default=None,
        help="Default: on with CUDA, off on the CPU. Generate under bf16 autocast.")
    add("--device", choices=choices["device"], default="auto",
        help="Default auto (cuda when available, else cpu).")
    add("--output-dir", type=text, default=None,
        help="Default none. Also write the metrics to OUTPUT_DIR/eval_metrics.json.")
    return parser
