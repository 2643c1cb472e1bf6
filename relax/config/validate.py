"""Every configuration rule of ``relax train``, in one place (reinforce_plus_plus.md §8).

:func:`resolve_and_validate` turns the parsed flags into the resolved run configuration
(derived batch sizes, output directory, ...) and raises :class:`ConfigError` for the first
rule a configuration breaks. It runs before torch, transformers, a model or any data is
loaded, and imports none of them: paths are checked with ``os.path`` and custom
``module:function`` paths with ``importlib.util.find_spec`` on the file system, without
executing user code.

The rules, in the order they are checked:

1. value ranges of single flags (finite, positive, in (0, 1], ...);
2. KL: ``--kl-coef`` and ``--kl-loss-coef`` never both nonzero, then the per-estimator KL rows;
3. the reinforce_plus_plus.md §8 rows for both REINFORCE++ variants and the modes that no estimator
   implements (``--fully-async``, ``--hybrid``, ``--context-parallel-size`` != 1);
4. flags the chosen estimator would ignore (rejected rather than silently dropped);
5. data, reward, model paths, run directories, evaluation (``eval_flags.py``);
6. batch arithmetic against the data-parallel world size (``WORLD_SIZE``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import time
from argparse import Namespace

from relax.rollout.reasoning_gym_source import is_reasoning_gym

ESTIMATOR_NAMES: tuple[str, ...] = (
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "grpo",
    "gspo",
    "sapo",
)
REINFORCE_PP: tuple[str, ...] = ESTIMATOR_NAMES[:2]
GROUP_RELATIVE: tuple[str, ...] = ESTIMATOR_NAMES[2:]
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A rejected configuration: ``str(e) == "--flag VALUE: reason and what to set instead"``.

    ``flag`` is the message head (the offending flag(s), usually with their values);
    ``flags`` lists just the flag names in it.
    """

    def __init__(self, flag: str, reason: str):
        flag, reason = _one_line(flag), _one_line(reason)
        super().__init__(f"{flag}: {reason}")
        self.flag = flag
        self.reason = reason

    @property
    def flags(self) -> list[str]:
        return [tok for tok in self.flag.split() if tok.startswith("--")]


def _one_line(message: str) -> str:
    """Escape newlines and other control characters a user value may carry."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _head(ns: Namespace, *dests: str) -> str:
    """``--flag VALUE`` for each dest (bare ``--flag`` for switches)."""
    parts = []
    for dest in dests:
        value = getattr(ns, dest)
        parts.append(_flag(dest) if isinstance(value, bool) else f"{_flag(dest)} {_fmt(value)}")
    return " ".join(parts)


def _reject(ns: Namespace, dests, reason: str):
    dests = (dests,) if isinstance(dests, str) else tuple(dests)
    raise ConfigError(_head(ns, *dests), reason)


# --------------------------------------------------------------------------- 1. ranges

# dest -> (predicate, what it must be)
_RANGES = {
    "gamma": (lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 (the default)"),
    "kl_coef": (lambda v: v >= 0.0, "must be >= 0; use 0 to turn reward KL shaping off"),
    "kl_loss_coef": (lambda v: v >= 0.0, "must be >= 0; use 0 to turn the KL loss off"),
    "entropy_coef": (lambda v: v >= 0.0, "must be >= 0; use 0 to turn the entropy bonus off"),
    "eps_clip": (lambda v: 0.0 < v < 1.0, "must lie in (0, 1); the usual value is 0.2"),
    "eps_clip_high": (lambda v: v is None or v > 0.0, "must be > 0, e.g. 0.28"),
    "eps_clip_c": (lambda v: v is None or v > 1.0, "the dual-clip bound must be > 1, e.g. 3.0"),
    "sapo_tau_pos": (lambda v: v > 0.0, "must be > 0; the default is 1.0"),
    "sapo_tau_neg": (lambda v: v > 0.0, "must be > 0; the default is 1.05"),
    "rollout_batch_size": (lambda v: v >= 1, "must be >= 1 prompts per rollout step"),
    "n_samples_per_prompt": (lambda v: v >= 1, "must be >= 1 responses per prompt"),
    "global_batch_size": (lambda v: v is None or v >= 1, "must be >= 1 samples per step"),
    "micro_batch_size": (lambda v: v is None or v >= 1, "must be >= 1 samples per rank"),
    "num_steps_per_rollout": (lambda v: v is None or v >= 1, "must be >= 1"),
    "num_rollout": (lambda v: v is None or v >= 1, "must be >= 1 rollout steps"),
    "num_epoch": (lambda v: v is None or v >= 1, "must be >= 1 passes over --prompt-data"),
    "rollout_max_response_len": (lambda v: v >= 1, "must be >= 1 tokens"),
    "rollout_temperature": (lambda v: v > 0.0, "must be > 0; use 1.0 for plain sampling"),
    "rollout_top_p": (lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 to turn it off"),
    "rollout_top_k": (lambda v: v == -1 or v >= 1, "must be >= 1, or -1 to turn top-k off"),
    "lr": (lambda v: v > 0.0, "must be > 0, e.g. 1e-6"),
    "weight_decay": (lambda v: v >= 0.0, "must be >= 0"),
    "adam_beta1": (lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.9"),
    "adam_beta2": (lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.999"),
    "clip_grad": (lambda v: v > 0.0, "must be > 0 (gradient-norm clip); the default is 1.0"),
    "seed": (lambda v: 0 <= v < 2**32, "must lie in [0, 2**32)"),
    "save_interval": (lambda v: v is None or v >= 1, "must be >= 1 rollout steps"),
    "keep_last": (lambda v: v is None or v >= 1, "must be >= 1 checkpoints"),
    # upper bounds: threading and timedelta overflow on huge values, and a wait of days is a
    # hang, not a timeout
    "peak_tflops": (lambda v: v is None or v > 0.0, "must be > 0 TFLOP/s, e.g. 989 for an "
                    "H100's bf16 dense peak; leave it out to measure"),
    "reward_timeout": (lambda v: 0.0 < v <= 86400.0,
                       "must lie in (0, 86400] seconds (one day); the default is 30"),
    "distributed_timeout_minutes": (lambda v: 0.0 < v <= 10080.0,
                                    "must lie in (0, 10080] minutes (one week); the default is 10"),
}


def _check_ranges(ns: Namespace) -> None:
    for dest, (ok, what) in _RANGES.items():
        if not ok(getattr(ns, dest)):
            _reject(ns, dest, what)


# --------------------------------------------------------------------------- 2-4. algorithm

def _check_kl(ns: Namespace) -> None:
    est = ns.advantage_estimator
    if ns.kl_coef != 0 and ns.kl_loss_coef != 0:
        _reject(ns, ("kl_coef", "kl_loss_coef"),
                "two reference-KL penalties at once; keep one (reward shaping --kl-coef for "
                "reinforce_plus_plus, the loss --use-kl-loss --kl-loss-coef otherwise) and set "
                "the other to 0")
    if est == "reinforce_plus_plus":
        if ns.kl_loss_type != "k1":
            _reject(ns, "kl_loss_type", "reinforce_plus_plus: the reward KL estimator is frozen "
                    "to signed k1 (reinforce_plus_plus.md §3); set --kl-loss-type k1")
        for dest in ("use_kl_loss", "kl_loss_coef"):
            if getattr(ns, dest):
                _reject(ns, dest, "reinforce_plus_plus has no second KL loss, KL enters only "
                        f"through the reward (reinforce_plus_plus.md §3); remove {_flag(dest)} and use --kl-coef")
        return
    if est == "reinforce_plus_plus_baseline":
        if ns.kl_coef != 0:
            _reject(ns, "kl_coef", "reinforce_plus_plus_baseline: KL never enters the "
                    "advantage (reinforce_plus_plus.md §4); set --kl-coef 0 and use --use-kl-loss --kl-loss-type "
                    "k2 --kl-loss-coef 0.01")
        if ns.use_kl_loss and ns.kl_loss_type != "k2":
            _reject(ns, ("use_kl_loss", "kl_loss_type"), "reinforce_plus_plus_baseline's KL "
                    "loss is the k2 penalty (reinforce_plus_plus.md §4); set --kl-loss-type k2")
    elif ns.kl_coef != 0:
        _reject(ns, "kl_coef", f"{est} has no reward KL shaping (only reinforce_plus_plus "
                "does); set --kl-coef 0 and use --use-kl-loss --kl-loss-coef instead")
    if not ns.use_kl_loss:
        if ns.kl_loss_coef > 0:
            _reject(ns, "kl_loss_coef", "has no effect without --use-kl-loss; add "
                    "--use-kl-loss or set --kl-loss-coef 0")
        if ns.kl_loss_type != "k1":
            _reject(ns, "kl_loss_type", "has no effect without --use-kl-loss; add "
                    "--use-kl-loss or remove --kl-loss-type")


def _check_modes(ns: Namespace) -> None:
    est = ns.advantage_estimator
    rpp = est in REINFORCE_PP
    for dest in ("fully_async", "hybrid"):
        if getattr(ns, dest):
            why = (f"{est}: the global normalization needs a closed synchronous global batch "
                   "(reinforce_plus_plus.md §6, 8)" if rpp else "not implemented")
            _reject(ns, dest, f"{why}; only synchronous colocate training runs, remove "
                    f"{_flag(dest)}")
    if ns.context_parallel_size != 1:
        why = (f"{est}: the normalization and the response-mean reduction are defined for "
               "whole sequences per rank (reinforce_plus_plus.md §8, 9)" if rpp else "context parallelism is not "
               "implemented")
        _reject(ns, "context_parallel_size", f"{why}; set --context-parallel-size 1")
    if rpp:
        if not ns.normalize_advantages:
            raise ConfigError(f"--advantage-estimator {est}", "requires --normalize-advantages "
                              "(the global token normalization of reinforce_plus_plus.md §6 is part of the "
                              "estimator); add --normalize-advantages")
        if ns.calculate_per_token_loss:
            _reject(ns, "calculate_per_token_loss", f"{est}: the objective is the response "
                    "mean (reinforce_plus_plus.md §7); remove --calculate-per-token-loss")
    if est == "reinforce_plus_plus_baseline" and ns.n_samples_per_prompt <= 1:
        _reject(ns, "n_samples_per_prompt", "reinforce_plus_plus_baseline: with one response "
                "per prompt every raw advantage would be 0 (reinforce_plus_plus.md §4); set "
                "--n-samples-per-prompt 8")


def _check_estimator_specific(ns: Namespace) -> None:
    """Reject flags the estimator would ignore; reinforce_plus_plus.md §3-§5, 7 say which estimator reads what."""
    est = ns.advantage_estimator
    if est in REINFORCE_PP:
        for dest in ("custom_advantage_function_path", "custom_reward_post_process_path"):
            value = getattr(ns, dest)
            if value is None:
                continue
            if est == "reinforce_plus_plus_baseline":
                _reject(ns, dest, f"{est}: it would bypass the frozen group-mean baseline "
                        f"semantics (reinforce_plus_plus.md §4, 8); remove {_flag(dest)}")
            if dest == "custom_advantage_function_path":
                _reject(ns, dest, f"{est}: it would replace the frozen reward-to-go advantage "
                        f"(reinforce_plus_plus.md §3); remove {_flag(dest)}")
        if ns.disable_grpo_std_normalization:
            _reject(ns, "disable_grpo_std_normalization", f"{est} never divides by a group "
                    "std, it uses the global token normalization (reinforce_plus_plus.md §6); remove it")
    if est != "reinforce_plus_plus" and ns.gamma != 1.0:
        _reject(ns, "gamma", f"{est} has no per-token discounted return, only "
                "reinforce_plus_plus reads --gamma (reinforce_plus_plus.md §3); set --gamma 1.0")
    if est != "sapo":
        for dest, default in (("sapo_tau_pos", 1.0), ("sapo_tau_neg", 1.05)):
            if getattr(ns, dest) != default:
                _reject(ns, dest, "only --advantage-estimator sapo reads it (reinforce_plus_plus.md §7); "
                        "remove it or choose sapo")
    if est == "sapo":
        for dest, default in (("eps_clip", 0.2), ("eps_clip_high", None), ("eps_clip_c", None)):
            if getattr(ns, dest) != default:
                _reject(ns, dest, "sapo uses the soft sigmoid gate, no clip (reinforce_plus_plus.md §7); remove "
                        "it or tune --sapo-tau-pos / --sapo-tau-neg")
    if est == "gspo" and ns.eps_clip_c is not None:
        _reject(ns, "eps_clip_c", "gspo has no dual clip (reinforce_plus_plus.md §7); remove --eps-clip-c")
    if ns.ref_load is not None and ns.kl_coef == 0 and not ns.use_kl_loss:
        _reject(ns, "ref_load", "no reference KL is on, so the reference model is never used; "
                "remove --ref-load or turn on a KL (--kl-coef or --use-kl-loss)")


# --------------------------------------------------------------------------- 5. paths, data

def _check_custom_path(ns: Namespace, dest: str) -> None:
    """``module:function`` or ``path/file.py:function``; the file or module must exist."""
    value = getattr(ns, dest)
    if value is None:
        return
    where, sep, func = value.rpartition(":")
    if not sep or not where or not all(p.isidentifier() for p in func.split(".")):
        _reject(ns, dest, "expected 'module:function' or 'path/file.py:function'")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            _reject(ns, dest, f"file {where!r} does not exist; give an existing .py file")
        return
    parts = where.split(".")
    if not all(p.isidentifier() for p in parts):
        _reject(ns, dest, f"{where!r} is not a module name; expected 'module:function' or "
                "'path/file.py:function'")
    # find_spec on a dotted name would import the parent packages; walk the file system
    # package by package instead so no user code runs during validation.
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                spec = None
                break
            spec = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        _reject(ns, dest, f"module {where!r} not found on the Python path; check the name or "
                "use 'path/file.py:function'")


def _check_dir(ns: Namespace, dest: str, what: str) -> None:
    value = getattr(ns, dest)
    if value is not None and not os.path.isdir(value):
        _reject(ns, dest, f"no such directory; point it at {what}")


def check_gym_spec(spec: str, flag: str, *, role: str):
    """Parse a ``reasoning-gym:`` source (imports the package, generates nothing)."""
    from relax.errors import InputError
    from relax.rollout.reasoning_gym_source import parse_spec

    try:
        return parse_spec(spec, flag, role=role)
    except InputError as e:
        head, _, reason = str(e).partition(": ")
        raise ConfigError(head, reason) from None


def check_gym_answer(ns: Namespace, explicit: set[str], sources: list) -> None:
    """``--reasoning-gym-answer`` only means something with a reasoning-gym source and the
    sources' own reward (not with --rm-type / --custom-rm-path)."""
    if "reasoning_gym_answer" not in explicit:
        return
    if not any(is_reasoning_gym(s) for s in sources):
        _reject(ns, "reasoning_gym_answer", "applies only to reasoning-gym:NAME sources of "
                "--prompt-data / --eval-prompt-data; remove it")
    if ns.rm_type is not None or ns.custom_rm_path is not None:
        _reject(ns, "reasoning_gym_answer", "the reward comes from --rm-type / "
                "--custom-rm-path, which read the response themselves; remove one of them")


def _check_data_and_model(ns: Namespace, explicit: set[str]) -> None:
    _check_dir(ns, "hf_checkpoint", "a Hugging Face model directory")
    if ns.hf_checkpoint is not None and not os.path.isfile(
            os.path.join(ns.hf_checkpoint, "config.json")):
        _reject(ns, "hf_checkpoint", "no config.json in it; point it at a Hugging Face model "
                "directory")
    _check_dir(ns, "ref_load", "a Hugging Face model directory with the reference weights")
    _check_dir(ns, "load", "a checkpoint directory written by --save")
    for dest in ("custom_advantage_function_path", "custom_reward_post_process_path",
                 "custom_rm_path"):
        _check_custom_path(ns, dest)
    if ns.prompt_data is not None:
        gym = is_reasoning_gym(ns.prompt_data)
        if gym:
            check_gym_spec(ns.prompt_data, "--prompt-data", role="train")
        elif not os.path.isfile(ns.prompt_data):
            _reject(ns, "prompt_data", "no such file; give a .jsonl or .parquet prompt file, "
                    "or reasoning-gym:NAME")
        if "builtin_task" in explicit:
            _reject(ns, "builtin_task", "is only used without --prompt-data; remove one of them")
        if gym:
            for dest in ("input_key", "label_key"):
                if dest in explicit:
                    _reject(ns, dest, "a reasoning-gym source has no record keys; remove it")
        elif ns.rm_type is None and ns.custom_rm_path is None:
            _reject(ns, "prompt_data", "needs a reward; add --rm-type math or --custom-rm-path "
                    "module:function")
    else:
        for dest, default in (("input_key", "input"), ("label_key", "label"),
                              ("rollout_shuffle", False)):
            if getattr(ns, dest) != default:
                _reject(ns, dest, f"only applies to --prompt-data; the built-in task "
                        f"{ns.builtin_task!r} is generated, remove {_flag(dest)}")
        if ns.rm_type is not None and ns.rm_type != ns.builtin_task:
            _reject(ns, "rm_type", f"the built-in task {ns.builtin_task!r} brings its own reward;"
                    f" remove --rm-type or give --prompt-data")
    if ns.rm_type is not None and ns.custom_rm_path is not None:
        _reject(ns, ("rm_type", "custom_rm_path"), "two reward functions; keep one")
    if ns.apply_chat_template and ns.hf_checkpoint is None:
        _reject(ns, "apply_chat_template", "the built-in tiny model has no chat template; "
                "add --hf-checkpoint or remove --apply-chat-template")
    if ns.use_wandb and importlib.util.find_spec("wandb") is None:
        _reject(ns, "use_wandb", "wandb is not installed; pip install 'relax-rl[wandb]' or "
                "remove --use-wandb")
    if ns.use_tensorboard and importlib.util.find_spec("tensorboard") is None:
        _reject(ns, "use_tensorboard", "tensorboard is not installed; pip install "
                "'relax-rl[train]' or remove --use-tensorboard")


def _check_run(ns: Namespace, explicit: set[str]) -> None:
    if ns.num_rollout is None and ns.prompt_data is None:
        _reject(ns, "num_rollout", "the built-in task has no end; set --num-rollout N")
    if ns.num_epoch is not None:
        if ns.prompt_data is None:
            _reject(ns, "num_epoch", "only applies to --prompt-data; use --num-rollout")
        if "num_rollout" in explicit:
            _reject(ns, ("num_rollout", "num_epoch"), "give one length: rollout steps or "
                    "passes over --prompt-data")
    if ns.save_interval is not None and ns.save is None:
        _reject(ns, "save_interval", "nothing is saved without --save DIR; add --save")
    if ns.keep_last is not None and ns.save is None:
        _reject(ns, "keep_last", "nothing is saved without --save DIR; add --save")
    for dest in ("save", "output_dir"):
        value = getattr(ns, dest)
        if value is not None and os.path.exists(value) and not os.path.isdir(value):
            _reject(ns, dest, "exists and is not a directory; choose another path")


# --------------------------------------------------------------------------- 6. batches

def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _resolve_batches(ns: Namespace, world_size: int) -> None:
    """Global batch = samples per optimizer step; micro batch = samples per rank per pass."""
    samples = ns.rollout_batch_size * ns.n_samples_per_prompt
    what = (f"a rollout step makes --rollout-batch-size {ns.rollout_batch_size} x "
            f"--n-samples-per-prompt {ns.n_samples_per_prompt} = {samples} samples")
    steps = ns.num_steps_per_rollout
    if ns.global_batch_size is None:
        if steps is not None and samples % steps:
            _reject(ns, "num_steps_per_rollout", f"{what}, not divisible into {steps} "
                    f"optimizer steps; use one of {_divisors(samples)}")
        ns.global_batch_size = samples // steps if steps is not None else samples
    if samples % ns.global_batch_size:
        _reject(ns, "global_batch_size", f"{what}, not a multiple of the global batch; use one "
                f"of {_divisors(samples)}")
    if steps is not None and steps * ns.global_batch_size != samples:
        _reject(ns, ("global_batch_size", "num_steps_per_rollout"), f"{what}, not "
                f"{steps} x {ns.global_batch_size}; give only one of the two")
    ns.num_steps_per_rollout = samples // ns.global_batch_size
    if ns.rollout_batch_size % world_size:
        _reject(ns, "rollout_batch_size", f"WORLD_SIZE={world_size} ranks need whole prompt "
                f"groups each; use a multiple of {world_size}")
    if ns.global_batch_size % world_size:
        _reject(ns, "global_batch_size", f"not divisible by WORLD_SIZE={world_size} ranks; use "
                f"a multiple of {world_size}")
    if ns.micro_batch_size is None:
        ns.micro_batch_size = ns.global_batch_size // world_size
    if ns.global_batch_size % (world_size * ns.micro_batch_size):
        _reject(ns, ("global_batch_size", "micro_batch_size"), f"the global batch must be a "
                f"multiple of WORLD_SIZE={world_size} x --micro-batch-size; use a micro batch "
                f"among {_divisors(ns.global_batch_size // world_size)}")


# --------------------------------------------------------------------------- entry

def world_size_from_env(environ=None) -> int:
    """Data-parallel world size: ``WORLD_SIZE`` as torchrun sets it, else 1."""
    environ = os.environ if environ is None else environ
    raw = environ.get("WORLD_SIZE", "1")
    try:
        world_size = int(raw)
    except ValueError:
        world_size = 0
    if world_size < 1:
        raise ConfigError(f"WORLD_SIZE={raw}", "must be a positive integer (torchrun sets it); "
                          "unset it for a single process")
    return world_size


def resolve_and_validate(ns: Namespace, explicit: set[str], world_size: int) -> Namespace:
    """Check every rule, fill the derived values in place, return ``ns``.

    Raises :class:`ConfigError` on the first broken rule.
    """
    _check_ranges(ns)
    _check_kl(ns)
    _check_modes(ns)
    _check_estimator_specific(ns)
    _check_data_and_model(ns, explicit)
    # imported here: eval_flags imports ConfigError from this module
    from relax.config.eval_flags import resolve_train_eval

    resolve_train_eval(ns, explicit)
    check_gym_answer(ns, explicit, [ns.prompt_data, *(p for _, p in ns.eval_prompt_data or ())])
    if ns.log_samples < 0:
        _reject(ns, "log_samples", "must be >= 0 samples per rollout step; 0 turns it off")
    _check_run(ns, explicit)
    _resolve_batches(ns, world_size)
    if ns.eps_clip_high is None:
        ns.eps_clip_high = ns.eps_clip
    if ns.num_epoch is None:
        ns.num_epoch = 1
    if ns.prompt_data is not None:
        ns.builtin_task = None  # the built-in task is not used; keep the JSON honest
    if ns.output_dir is None:
        ns.output_dir = os.path.join(
            "runs", f"{ns.advantage_estimator}-{time.strftime('%Y%m%d-%H%M%S')}")
    ns.world_size = world_size
    return ns
