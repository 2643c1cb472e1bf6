"""The typed configuration of ``relax train`` and ``relax eval``: one frozen dataclass each.

Every flag is a field; its ``option(...)`` holds the default (the only place it is written:
``--help`` writes "Default X." from it, :func:`help_text`) and the help text that ``--help``
prints (``relax.config.flags`` builds the parsers from these fields); docs/configuration.md
repeats the defaults (a test keeps them in sync). The components read the config through its
sections (``cfg.rollout.temperature``, relax/config/sections.py). Fields with
``flag=False`` are derived during resolution. A config is built once, after the built-in preset
is applied, and never changed afterwards: resolution makes a new one (``dataclasses.replace``).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

from relax.config.gym_spec import ANSWER_FORMATS
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.sections import (
    AlgorithmSection,
    BatchSection,
    CheckpointSection,
    EvaluationSection,
    LoraSection,
    RolloutSection,
)
from relax.estimators import ESTIMATOR_NAMES, KL_KINDS

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
RM_TYPES: tuple[str, ...] = ("math", *BUILTIN_TASK_NAMES)

# Argument groups of ``relax train --help``, in order.
GROUPS: dict[str, str] = {
    "algorithm": "Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7).",
    "batches": "Sizes in prompts and samples (responses).",
    "model and data": "Defaults: the built-in tiny model and task.",
    "lora": "Low-rank adapters instead of full fine-tuning (peft).",
    "optimizer": "AdamW, constant learning rate.",
    "modes": "Only synchronous colocate training is implemented (reinforce_plus_plus.md §9).",
    "evaluation": "Periodic evaluation during training: pass@k (unbiased) and mean reward on "
                  "held-out prompts (docs/configuration.md).",
    "environments": "Multi-turn episodes: the model acts, an environment or an agent program's "
                    "tools answer (relax/rollout/envs.py, episodes.py, agent_server.py).",
    "run": "Output, checkpoints, logging.",
}


def option(default, help: str, *, group: str, choices: tuple | None = None,
           nargs: str | None = None, metavar: str | None = None, flag: bool = True,
           positional: bool = False, default_text: str | None = None,
           default_note: str | None = None):
    """A config field: its default and the metadata its command-line flag is built from.

    ``help`` says what the flag does; ``--help`` prefixes it with the default, written from
    ``default`` ("Default 8.", "Default off."), followed by ``default_note`` in parentheses
    ("Default -1 (off)."), or replaced by ``default_text`` where the default needs words
    ("Default: the built-in task's fixed evaluation prompts.")."""
    return field(default=default, metadata=dict(
        help=help, group=group, choices=choices, nargs=nargs, metavar=metavar, flag=flag,
        positional=positional, default_text=default_text, default_note=default_note))


def default_words(value) -> str:
    """A default as ``--help`` writes it: on/off, none, 1e-6, 0.2, grpo."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        mantissa, e, exponent = f"{value:g}".partition("e")
        return mantissa + (f"e{int(exponent)}" if e else "")
    return str(value)


def help_text(f: dataclasses.Field) -> str:
    """The ``--help`` text of a flag field: its default, then what it does."""
    md = f.metadata
    if md["positional"]:
        return md["help"]
    if md["default_text"] is not None:
        default = f"Default: {md['default_text']}."
    else:
        note = f" ({md['default_note']})" if md["default_note"] else ""
        default = f"Default {default_words(f.default)}{note}."
    return f"{default} {md['help']}".rstrip()


def derived(default=None, help: str = ""):
    """A field filled in by resolution, not a flag."""
    return field(default=default, metadata=dict(help=help, flag=False))


# ------------------------------------------------------------------ fields of both commands

def _eval_prompt_data():
    return option(None, "PATH, or NAME "
                  "PATH pairs, of .jsonl/.parquet prompt files or reasoning-gym:NAME sources; "
                  "fields --input-key / --label-key, scored with the run's reward.",
                  default_text="the built-in task's fixed evaluation prompts",
                  group="evaluation", nargs="+", metavar="[NAME] PATH")


def _n_samples_per_eval_prompt():
    return option(1, "Responses per evaluation prompt; pass@k is logged for k = 1, "
                  "2, 4, ... up to this number.", group="evaluation")


def _follows(what: str, fallback: str, rest: str):
    """An evaluation sampling flag whose default follows the rollout's (relax/config/eval_flags.py)."""
    return option(None, rest, group="evaluation",
                  default_text=f"in relax train the rollout's {what}, in relax eval {fallback}")


def _eval_temperature():
    return _follows("temperature", "1.0", "Sampling temperature >= 0; 0 is greedy.")


def _eval_top_p():
    return _follows("top-p", "1.0", "Nucleus sampling mass in (0, 1].")


def _eval_top_k():
    return _follows("top-k", "-1 (off)", "Top-k sampling, >= 1 or -1.")


def _eval_max_response_len():
    return _follows("maximum response length", "1024 (the preset's for the built-in task)",
                    "Maximum generated tokens per evaluation response.")


def _eval_batch_size():
    return option(64, "Sequences (prompts x samples) per generation call.",
                  group="evaluation")


def _eval_pass_threshold():
    return option(1.0, "A response passes (counts for pass@k) when its reward is "
                  ">= this.", group="evaluation")


def _env():
    return option(
        None, "Multi-turn episodes against an environment: "
        "gem:ID, textarena:ID (pip install 'relax-rl[agents]') or 'module:factory' / "
        "'file.py:factory' (relax/rollout/envs.py); excludes prompt data and the reward flags "
        "(the environment scores the episode).",
        default_note='single-turn prompts', group="environments")


def _max_turns():
    return option(
        4, "Most model turns per --env or --use-agentic-rollout episode; each turn "
        "generates at most the response length (--rollout-max-response-len; in evaluation "
        "--eval-max-response-len).", group="environments")


def _eval_episodes():
    return option(
        64, "With --env: episodes of the held-out environment seeds 1000000000, "
        "1000000001, ... an evaluation plays (--n-samples-per-eval-prompt plays each); an "
        "episode passes when its reward is >= --eval-pass-threshold.", group="evaluation")


def _input_key():
    return option("input", "Prompt field of the prompt files' records.",
                  group="model and data")


def _label_key():
    return option("label", "Label field of the prompt files' records, passed to "
                  "the reward.", group="model and data")


def _reasoning_gym_answer():
    return option("tags", "How "
                  "the answer of a reasoning-gym source is read: tags, last_number or boxed.",
                  default_note="reasoning-gym's <answer> tags and system prompt",
                  group="model and data", choices=ANSWER_FORMATS)


def _apply_chat_template():
    return option(False, "Wrap prompts in the model tokenizer's chat template.",
                  group="model and data")


def _system_prompt():
    return option(None, "System message: in the chat template with "
                  "--apply-chat-template, else a line before the prompt.", group="model and data")


def _rm_type():
    return option(None, "Reward for prompt files: math "
                  "(math-verify answer check) or a built-in task's reward.",
                  default_text="the built-in task's reward", group="model and data",
                  choices=RM_TYPES)


def _custom_rm_path():
    return option(None, "'module:function' or 'file.py:function' reward; "
                  "excludes --rm-type.", group="model and data")


def _builtin_task():
    return option(BUILTIN_TASK_NAMES[0], "Built-in task used without prompt files.",
                  default_note="the preset may change it", group="model and data",
                  choices=BUILTIN_TASK_NAMES)


def _seed():
    return option(1234, "Seed of every RNG.", group="optimizer")


def _bf16():
    return option(None, "Forward passes under bf16 "
                  "autocast; fp32 master weights, AdamW state and log-prob math; reference "
                  "stored in bf16.", default_text='on with CUDA, off on the CPU', group="modes")


def _device():
    return option("auto", "", default_note="cuda when available, else cpu", group="modes",
                  choices=DEVICES)


@dataclass(frozen=True)
class TrainConfig:
    """``relax train`` settings (rules: reinforce_plus_plus.md §8 and relax/config/validate.py)."""

    # algorithm
    advantage_estimator: str = option(
        "grpo", "The advantage estimator and with it the policy loss "
        "(reinforce_plus_plus.md §3-§5, 7).", group="algorithm", choices=ESTIMATOR_NAMES)
    normalize_advantages: bool = option(
        False, "REINFORCE++ variants: global masked population normalization, "
        "required (reinforce_plus_plus.md §6, 8). grpo/gspo/sapo: masked_whiten "
        "(reinforce_plus_plus.md §5).", group="algorithm")
    gamma: float = option(
        1.0, "Discount of the reward-to-go return, in (0, 1]; only "
        "reinforce_plus_plus reads it (reinforce_plus_plus.md §3).", group="algorithm")
    kl_coef: float = option(
        0.0, "Reward-shaping KL coefficient beta >= 0; only reinforce_plus_plus "
        "(recipe 0.01, reinforce_plus_plus.md §3). Must be 0 for the others "
        "(reinforce_plus_plus.md §4, 8).", group="algorithm")
    kl_loss_type: str = option(
        "k1", "KL estimator of --use-kl-loss (reinforce_plus_plus.md §2), inert "
        "without it; reinforce_plus_plus requires k1 (reward shaping), "
        "reinforce_plus_plus_baseline's KL loss k2 (reinforce_plus_plus.md §8).",
        group="algorithm", choices=KL_KINDS)
    use_kl_loss: bool = option(
        False, "Add the separate reference KL loss (reinforce_plus_plus.md §7); "
        "rejected for reinforce_plus_plus (reinforce_plus_plus.md §8).", group="algorithm")
    kl_loss_coef: float = option(
        0.0, "Weight of the KL loss, >= 0, needs --use-kl-loss; never nonzero "
        "together with --kl-coef (reinforce_plus_plus.md §7, 8).", group="algorithm")
    entropy_coef: float = option(
        0.0, "Entropy bonus weight, >= 0: loss -= coef * entropy "
        "(reinforce_plus_plus.md §7).", group="algorithm")
    eps_clip: float = option(
        0.2, "Lower PPO clip eps_low, in (0, 1) (reinforce_plus_plus.md §7); not "
        "for sapo.", group="algorithm")
    eps_clip_high: float | None = option(
        None, "Upper PPO clip eps_high > 0 (reinforce_plus_plus.md §7); "
        "not for sapo.", default_text='--eps-clip', group="algorithm")
    eps_clip_c: float | None = option(
        None, "Dual-clip bound c > 1 for negative advantages "
        "(reinforce_plus_plus.md §7); grpo and the REINFORCE++ variants only.",
        default_text='off', group="algorithm")
    sapo_tau_pos: float = option(
        1.0, "SAPO gate temperature for A > 0 (reinforce_plus_plus.md §7); sapo "
        "only.", group="algorithm")
    sapo_tau_neg: float = option(
        1.05, "SAPO gate temperature for A <= 0 (reinforce_plus_plus.md §7); sapo "
        "only.", group="algorithm")
    disable_grpo_std_normalization: bool = option(
        False, "grpo/gspo/sapo: do not divide the group-centred reward by the "
        "group std (reinforce_plus_plus.md §5).", group="algorithm")
    calculate_per_token_loss: bool = option(
        False, "grpo/gspo/sapo: global token-mean reduction; "
        "rejected for the REINFORCE++ variants (reinforce_plus_plus.md §7, 8).",
        default_note='response mean', group="algorithm")
    custom_advantage_function_path: str | None = option(
        None, "'module:function' or 'file.py:function' replacing the advantage "
        "of grpo/gspo/sapo; rejected for the REINFORCE++ variants (reinforce_plus_plus.md §8).",
        group="algorithm")
    custom_reward_post_process_path: str | None = option(
        None, "'module:function' or 'file.py:function' post-processing rewards; "
        "rejected for reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).",
        group="algorithm")

    # batches
    rollout_batch_size: int = option(
        8, "Prompts per rollout step; a multiple of WORLD_SIZE.", group="batches")
    n_samples_per_prompt: int = option(
        1, "Responses per prompt (a group); > 1 for reinforce_plus_plus_baseline "
        "(reinforce_plus_plus.md §8).", group="batches")
    global_batch_size: int | None = option(
        None, "Samples per "
        "optimizer step; divides the rollout samples, multiple of WORLD_SIZE x "
        "--micro-batch-size (reinforce_plus_plus.md §7: one step's loss).",
        default_text='rollout samples (one optimizer step per rollout)', group="batches")
    micro_batch_size: int | None = option(
        None, "Samples per forward/backward per rank.",
        default_text='global batch / WORLD_SIZE', group="batches")
    use_dynamic_batch_size: bool = option(
        False, "Token-budget micro-batches: rows grouped by length into "
        "micro-batches of at most --max-tokens-per-gpu padded tokens (instead of "
        "--micro-batch-size rows); the loss is the same (reinforce_plus_plus.md §7).",
        group="batches")
    max_tokens_per_gpu: int | None = option(
        None, "Padded tokens (prompt + "
        "response) per micro-batch of the update.",
        default_text='none; required by --use-dynamic-batch-size', group="batches")
    log_probs_max_tokens_per_gpu: int | None = option(
        None, "The same budget for the no-grad old and "
        "reference log-prob passes (no activations kept, so it can be larger).",
        default_text='--max-tokens-per-gpu', group="batches")
    num_steps_per_rollout: int | None = option(
        None, "Optimizer steps per rollout step; "
        "alone it sets the global batch.",
        default_text='rollout samples / global batch', group="batches")
    num_rollout: int | None = option(
        None, "Rollout steps to run; required without --prompt-data.",
        group="batches")
    num_epoch: int | None = option(
        None, "Passes over --prompt-data when --num-rollout is not given.",
        default_text='1', group="batches")
    dynamic_sampling_filter_path: str | None = option(
        None, "DAPO-style dynamic sampling: a group filter, nonzero_std (keep "
        "groups whose rewards are not all equal) or 'module:function' / 'file.py:function' "
        "(rewards, responses, label) -> bool. Prompts are generated in rounds until "
        "--rollout-batch-size groups pass; the step trains on those only.",
        default_text='off', group="batches")
    over_sampling_batch_size: int | None = option(
        None, "Prompts generated per dynamic-sampling round; "
        ">= --rollout-batch-size, a multiple of WORLD_SIZE.",
        default_text='--rollout-batch-size', group="batches")
    dynamic_sampling_max_rounds: int = option(
        8, "Bound on the dynamic-sampling rounds of one rollout step; when it is "
        "reached the step trains on the groups that passed (rollout/groups_trained), or skips "
        "the update when none did.", group="batches")

    # LoRA
    lora_rank: int = option(
        0, "LoRA rank R: train low-rank adapters (peft) on "
        "--lora-target-modules instead of the weights; the reference is the same model with "
        "the adapter off.", default_note='off: full fine-tuning', group="lora")
    lora_alpha: float = option(
        16.0, "LoRA scaling alpha (the update is scaled by alpha / R).",
        group="lora")
    lora_dropout: float = option(
        0.0, "Dropout on the adapter's input, in [0, 1).", group="lora")
    lora_target_modules: list | None = option(
        None, "Hugging Face module names, or Relax's Megatron names linear_qkv linear_proj "
        "linear_fc1 linear_fc2.", default_text="every linear layer of the blocks (q_proj k_proj "
        "v_proj o_proj gate_proj up_proj down_proj)", group="lora", nargs="+", metavar="NAME")

    # model and data
    hf_checkpoint: str | None = option(
        None, "Hugging Face model directory (with config.json).",
        default_text='built-in tiny model', group="model and data")
    ref_load: str | None = option(
        None, "Reference model directory; only with a KL "
        "(--kl-coef or --use-kl-loss).",
        default_text='the initial policy weights', group="model and data")
    prompt_data: str | None = option(
        None, "Prompt file (.jsonl or .parquet; needs --rm-type or "
        "--custom-rm-path), or reasoning-gym:NAME?key=value&... (a reasoning-gym dataset, "
        "scored by its own verifier unless a reward flag is given).",
        default_text='the built-in task', group="model and data")
    reasoning_gym_answer: str = _reasoning_gym_answer()
    input_key: str = _input_key()
    label_key: str = _label_key()
    apply_chat_template: bool = _apply_chat_template()
    system_prompt: str | None = _system_prompt()
    rollout_shuffle: bool = option(
        False, "Shuffle --prompt-data each epoch (seeded).", group="model and data")
    rollout_max_response_len: int = option(
        1024, "Maximum generated tokens per response; longer ones are truncated.",
        group="model and data")
    rollout_temperature: float = option(
        1.0, "Sampling temperature > 0.", group="model and data")
    rollout_top_p: float = option(
        1.0, "Nucleus sampling mass in (0, 1].", default_note="off",
        group="model and data")
    rollout_top_k: int = option(
        -1, "Top-k sampling, >= 1 or -1.", default_note='off', group="model and data")
    rm_type: str | None = _rm_type()
    custom_rm_path: str | None = _custom_rm_path()
    builtin_task: str | None = _builtin_task()

    # optimizer
    lr: float = option(1e-6, "Learning rate > 0.", group="optimizer")
    weight_decay: float = option(0.0, "AdamW weight decay.", group="optimizer")
    adam_beta1: float = option(0.9, "AdamW beta1.", group="optimizer")
    adam_beta2: float = option(0.999, "AdamW beta2.", group="optimizer")
    clip_grad: float = option(1.0, "Gradient-norm clip > 0.", group="optimizer")
    seed: int = _seed()

    # modes
    colocate: bool = option(
        True, "Rollout then train on the same devices; accepted, it is the only "
        "mode.", group="modes")
    fully_async: bool = option(
        False, "Rejected: not implemented; for the REINFORCE++ variants the "
        "normalization needs a closed global batch (reinforce_plus_plus.md §8).", group="modes")
    hybrid: bool = option(
        False, "Rejected like --fully-async (reinforce_plus_plus.md §8).",
        group="modes")
    context_parallel_size: int = option(
        1, "Values other than 1 are rejected (reinforce_plus_plus.md §8, 9).",
        group="modes")
    fsdp: bool = option(
        False, "Shard parameters with FSDP2 fully_shard.",
        default_note='DDP replication', group="modes")
    peak_tflops: float | None = option(
        None, "Peak "
        "TFLOP/s per rank that perf/*_mfu divides by.",
        default_text="measured at start-up (a square matmul in the run's dtype)", group="modes")
    bf16: bool | None = _bf16()
    device: str = _device()

    # evaluation
    eval_interval: int | None = option(
        None, "Evaluate every N rollout steps and log "
        "eval/<name>/pass@k and eval/<name>/mean_reward.",
        default_note='no evaluation', group="evaluation")
    eval_prompt_data: list | None = _eval_prompt_data()
    n_samples_per_eval_prompt: int = _n_samples_per_eval_prompt()
    eval_temperature: float | None = _eval_temperature()
    eval_top_p: float | None = _eval_top_p()
    eval_top_k: int | None = _eval_top_k()
    eval_max_response_len: int | None = _eval_max_response_len()
    eval_batch_size: int = _eval_batch_size()
    eval_pass_threshold: float = _eval_pass_threshold()

    # environments
    env: str | None = _env()
    max_turns: int = _max_turns()
    eval_episodes: int = _eval_episodes()
    use_agentic_rollout: bool = option(
        False, "Each episode is a run of --agent-command against an "
        "OpenAI-compatible endpoint on 127.0.0.1 that samples from the policy and records the "
        "conversation token-in/token-out (relax/rollout/agent_server.py).", group="environments")
    agent_command: str | None = option(
        None, "The agent program, started once per episode with RELAX_BASE_URL, "
        "RELAX_SESSION_ID, RELAX_INPUT_JSON and RELAX_OUTPUT_JSON in its environment; needs "
        "--use-agentic-rollout.", group="environments")
    agent_timeout: float = option(
        600.0, "Seconds an agent episode may run; then its process group is "
        "killed and the episode fails (reward 0).", group="environments")

    # run
    output_dir: str | None = option(
        None, "Gets config.json and the metrics.",
        default_text='runs/<estimator>-<YYYYmmdd-HHMMSS>', group="run")
    save: str | None = option(
        None, "Checkpoint directory.", default_note='no checkpoints', group="run")
    exit_duration_in_mins: float | None = option(
        None, "A wall-clock budget: after the first rollout step that ends this "
        "many minutes after relax train started, evaluate (with --eval-interval) and save "
        "(with --save) as at the last step, then exit 0. Resuming with --load continues the "
        "remaining steps on a fresh budget.", group="run")
    save_interval: int | None = option(
        None, "Rollout steps between checkpoints; needs --save.",
        default_text='only at the end', group="run")
    load: str | None = option(
        None, "Checkpoint directory to resume from.", group="run")
    keep_last: int | None = option(
        None, "Keep only the newest K interval checkpoints; needs --save.",
        default_text='keep all', group="run")
    async_save: bool = option(
        False, "Write each interval checkpoint on a background thread while the "
        "next rollout step runs; a checkpoint counts only once completely written "
        "(docs/reliability.md).", group="run")
    checkpoint_checksums: bool = option(
        False, "Record the SHA-256 of every checkpoint file "
        "when saving and compare it at --load (reads every byte of the checkpoint).",
        default_note='file sizes only', group="run")
    reward_timeout: float = option(
        30.0, "Seconds per sample a reward function may take "
        "(docs/reliability.md).", group="run")
    reward_error_policy: str = option(
        "raise", "A reward that raises, times out or is NaN/Inf: stop with an "
        "error naming the sample, or score it 0 and count it in rollout/reward_errors.",
        group="run", choices=("raise", "zero"))
    distributed_timeout_minutes: float = option(
        10.0, "Collective timeout: a rank that waits longer for its peers exits "
        "with an error.", group="run")
    log_samples: int = option(
        4, "Samples per rollout step appended to OUTPUT_DIR/samples.jsonl (prompt, "
        "response, reward, label); 0 turns it off.", group="run")
    use_tensorboard: bool = option(
        False, "Also write TensorBoard event files.", group="run")
    use_wandb: bool = option(
        False, "Also log to Weights & Biases (needs wandb).", group="run")
    dry_run: bool = option(
        False, "Validate, print the resolved configuration as JSON, exit 0 "
        "without loading a model or data.", group="run")

    # resolved, not flags
    world_size: int = derived(1, "Data-parallel ranks (WORLD_SIZE).")
    builtin_preset_applied: bool = derived(False, "Whether the built-in preset set defaults.")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    # the sections each component takes (relax/config/sections.py); views, not fields
    @cached_property
    def algorithm(self) -> AlgorithmSection:
        return AlgorithmSection.of(self)

    @cached_property
    def batches(self) -> BatchSection:
        return BatchSection.of(self)

    @cached_property
    def rollout(self) -> RolloutSection:
        return RolloutSection.of(self)

    @cached_property
    def lora(self) -> LoraSection:
        return LoraSection.of(self)

    @cached_property
    def evaluation(self) -> EvaluationSection:
        return EvaluationSection.of(self)

    @cached_property
    def checkpoint(self) -> CheckpointSection:
        return CheckpointSection.of(self)


@dataclass(frozen=True)
class EvalConfig:
    """``relax eval CHECKPOINT`` settings (rules: relax/config/eval_flags.py)."""

    checkpoint: str = option(
        "", "A --save directory of relax train (its final model), a directory written by "
        "relax export, or any Hugging Face causal LM directory.", group="evaluation", metavar="CHECKPOINT",
        positional=True)
    eval_prompt_data: list | None = _eval_prompt_data()
    n_samples_per_eval_prompt: int = _n_samples_per_eval_prompt()
    eval_temperature: float | None = _eval_temperature()
    eval_top_p: float | None = _eval_top_p()
    eval_top_k: int | None = _eval_top_k()
    eval_max_response_len: int | None = _eval_max_response_len()
    eval_batch_size: int = _eval_batch_size()
    eval_pass_threshold: float = _eval_pass_threshold()
    input_key: str = _input_key()
    label_key: str = _label_key()
    rm_type: str | None = _rm_type()
    custom_rm_path: str | None = _custom_rm_path()
    apply_chat_template: bool = _apply_chat_template()
    system_prompt: str | None = _system_prompt()
    reasoning_gym_answer: str = _reasoning_gym_answer()
    builtin_task: str | None = _builtin_task()
    seed: int = _seed()
    bf16: bool | None = _bf16()
    device: str = _device()
    env: str | None = _env()
    max_turns: int = _max_turns()
    eval_episodes: int = _eval_episodes()
    output_dir: str | None = option(
        None, "Also write the metrics to OUTPUT_DIR/eval_metrics.json.",
        group="evaluation")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @cached_property
    def evaluation(self) -> EvaluationSection:
        """The evaluation section ``relax train`` has too (relax/config/sections.py)."""
        return EvaluationSection.of(self)
