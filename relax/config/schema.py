"""The typed configuration of ``relax train`` and ``relax eval``: one frozen dataclass each.

Every flag is a field; its ``option(...)`` holds the default (the only place it is written:
``--help`` writes "Default X." from it, relax/config/fields.py) and the help text that ``--help``
prints (``relax.config.flags`` builds the parsers from these fields); docs/configuration.md
repeats the defaults (a test keeps them in sync). The components read the config through its
sections (``cfg.rollout.temperature``, relax/config/sections.py). Fields with
``flag=False`` are derived during resolution. A config is built once, after the built-in preset
is applied, and never changed afterwards: resolution makes a new one (``dataclasses.replace``).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from relax.config.async_fields import FullyAsyncFields
from relax.config.critic_fields import CriticFields
from relax.config.fields import (
    apply_chat_template_option,
    bf16_option,
    builtin_task_option,
    custom_rm_path_option,
    derived,
    device_option,
    env_option,
    env_step_timeout_option,
    eval_batch_size_option,
    eval_episodes_option,
    eval_max_response_len_option,
    eval_pass_threshold_option,
    eval_prompt_data_option,
    eval_temperature_option,
    eval_top_k_option,
    eval_top_p_option,
    host_mmap_threshold_kb_option,
    input_key_option,
    label_key_option,
    max_turns_option,
    n_samples_per_eval_prompt_option,
    option,
    reasoning_gym_answer_option,
    rm_type_option,
    seed_option,
    system_prompt_option,
)
from relax.config.opd_fields import DistillationFields
from relax.config.reward_services import (
    genrm_max_response_len_option,
    genrm_model_path_option,
    genrm_prompt_template_option,
    group_rm_option,
    reward_max_concurrency_option,
    rm_batch_size_option,
    rm_retries_option,
    rm_retry_backoff_option,
    rm_url_option,
)
from relax.config.rollout_backend import (
    rollout_backend_option,
    vllm_request_timeout_option,
    vllm_startup_timeout_option,
    vllm_url_option,
)
from relax.config.sections import (
    AlgorithmSection,
    BatchSection,
    CheckpointSection,
    EvaluationSection,
    LoraSection,
    RecomputeSection,
    RolloutSection,
)
from relax.estimators import ESTIMATOR_NAMES, KL_KINDS


@dataclass(frozen=True)
class TrainConfig(FullyAsyncFields, DistillationFields, CriticFields):
    """``relax train`` settings (rules: reinforce_plus_plus.md §8 and relax/config/validate.py)."""

    # algorithm
    advantage_estimator: str = option(
        "grpo", "The advantage estimator and with it the policy loss "
        "(reinforce_plus_plus.md §3-§5b, 7).", group="algorithm", choices=ESTIMATOR_NAMES)
    normalize_advantages: bool = option(
        False, "REINFORCE++ variants: global masked population normalization, "
        "required (reinforce_plus_plus.md §6, 8). grpo/gspo/sapo/cispo: masked_whiten "
        "(reinforce_plus_plus.md §5); rejected for rloo (§5a).", group="algorithm")
    gamma: float = option(
        1.0, "Discount of the reward-to-go return, in (0, 1]; only "
        "reinforce_plus_plus (reinforce_plus_plus.md §3) and ppo's GAE (§5c) read it.", group="algorithm")
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
        0.2, "Lower PPO clip eps_low, in (0, 1) (reinforce_plus_plus.md §7); cispo: "
        "its weight's floor 1 - eps_low for A < 0 (§5b); not for sapo or rloo.",
        group="algorithm")
    eps_clip_high: float | None = option(
        None, "Upper PPO clip eps_high > 0 (reinforce_plus_plus.md §7); cispo: its "
        "weight's cap 1 + eps_high for A >= 0 (§5b); not for sapo or rloo.",
        default_text='--eps-clip', group="algorithm")
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
        False, "grpo/gspo/sapo/cispo: do not divide the group-centred reward by the "
        "group std (reinforce_plus_plus.md §5).", group="algorithm")
    calculate_per_token_loss: bool = option(
        False, "grpo/gspo/sapo: global token-mean reduction; required for rloo and "
        "cispo (§5a, §5b); rejected for the REINFORCE++ variants (reinforce_plus_plus.md §7, 8).",
        default_note='response mean', group="algorithm")
    custom_advantage_function_path: str | None = option(
        None, "'module:function' or 'file.py:function' replacing the advantage "
        "of grpo/gspo/sapo/cispo/rloo; rejected for the REINFORCE++ variants "
        "(reinforce_plus_plus.md §8).",
        group="algorithm")
    custom_reward_post_process_path: str | None = option(
        None, "'module:function' or 'file.py:function' post-processing rewards; "
        "rejected for reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).",
        group="algorithm")

    # off-policy (reinforce_plus_plus.md §7a)
    use_rollout_logprobs: bool = option(
        False, "pi_old of the PPO ratio is the sampler's log-prob of each token (kept by the "
        "decode, no extra pass) instead of the trainer's; rejected for rloo (no ratio).",
        group="off-policy")
    get_mismatch_metrics: bool | None = option(
        None, "rollout/logprob_abs_diff (mean, max), rollout/mismatch_k1, _k3 and "
        "_ratio_outside between the sampler's and the trainer's log-probs of the trained "
        "tokens; --no-get-mismatch-metrics turns them off.",
        default_text="on (free: elementwise over log-probs the update already holds)",
        group="off-policy")
    use_tis: bool = option(
        False, "Truncated importance sampling: each token's policy loss times "
        "clamp(pi_trainer / pi_sampler, --tis-clip-low, --tis-clip), a constant.",
        group="off-policy")
    tis_clip: float = option(
        2.0, "Upper clip of the TIS weight, > 0, at most 3.4e38 (float32); needs --use-tis.",
        group="off-policy")
    tis_clip_low: float = option(
        0.0, "Lower clip of the TIS weight, in [0, --tis-clip]; needs --use-tis.",
        group="off-policy")
    custom_tis_function_path: str | None = option(
        None, "'module:function' or 'file.py:function' computing the TIS weights: "
        "f(trainer_log_probs, sampler_log_probs, mask) -> weights [B, T], finite and >= 0 on "
        "the mask; needs --use-tis.", group="off-policy")
    use_opsm: bool = option(
        False, "Off-policy sequence masking: drop from the policy loss a response with a "
        "negative advantage whose mean log(pi_sampler / pi_theta) exceeds --opsm-delta.",
        group="off-policy")
    opsm_delta: float = option(
        1e-4, "OPSM threshold, > 0; needs --use-opsm.", group="off-policy")
    partial_rollout: bool = option(
        False, "Start --over-sampling-batch-size groups per step, stop decoding once "
        "--rollout-batch-size of them are complete, and continue the unfinished ones in the "
        "next step under the newer policy (relax/rollout/partial.py); deterministic: the stop "
        "counts tokens, not time.", group="off-policy")
    partial_rollout_max_aborted_count: int = option(
        2, "Most steps one group may be carried over unfinished; a step waits for groups at "
        "the bound. Needs --partial-rollout.", group="off-policy")
    mask_offpolicy_in_partial_rollout: bool = option(
        False, "Leave tokens an earlier step sampled out of the loss (they stay in the "
        "context); without it --use-tis or --use-rollout-logprobs must weigh them. Needs "
        "--partial-rollout.", group="off-policy")

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
        False, "Token-budget micro-batches of at most --max-tokens-per-gpu tokens "
        "(instead of --micro-batch-size rows): packed passes take rows in order while their "
        "lengths fit; --pass-layout padded groups rows by length and counts padded slots. "
        "The loss is the same (reinforce_plus_plus.md §7).",
        group="batches")
    max_tokens_per_gpu: int | None = option(
        None, "Tokens (prompt + response; "
        "padded slots with --pass-layout padded) per micro-batch of the update.",
        default_text='none; required by --use-dynamic-batch-size', group="batches")
    log_probs_max_tokens_per_gpu: int | None = option(
        None, "The same budget for the no-grad old and "
        "reference log-prob passes (no activations kept, so it can be larger).",
        default_text='--max-tokens-per-gpu', group="batches")
    pass_layout: str = option(
        "shared-prefix", "How the old-policy, reference and update passes lay out a "
        "micro-batch. shared-prefix: its rows as one sequence without padding, attention "
        "within each row, the samples of a prompt sharing one copy of it (log-probs and "
        "gradients equal the padded passes'); packed: the same, every row with its own "
        "prompt; padded: every row padded to the longest of its micro-batch. Llama and Qwen3 "
        "models pack; other models, and rows whose attention has holes, run padded.",
        group="batches", choices=("shared-prefix", "packed", "padded"))
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
    reasoning_gym_answer: str = reasoning_gym_answer_option()
    input_key: str = input_key_option()
    label_key: str = label_key_option()
    apply_chat_template: bool = apply_chat_template_option()
    system_prompt: str | None = system_prompt_option()
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
    rm_type: str | None = rm_type_option()
    custom_rm_path: str | None = custom_rm_path_option()
    builtin_task: str | None = builtin_task_option()

    # optimizer
    lr: float = option(1e-6, "Learning rate > 0.", group="optimizer")
    weight_decay: float = option(0.0, "AdamW weight decay.", group="optimizer")
    adam_beta1: float = option(0.9, "AdamW beta1.", group="optimizer")
    adam_beta2: float = option(0.999, "AdamW beta2.", group="optimizer")
    clip_grad: float = option(1.0, "Gradient-norm clip > 0.", group="optimizer")
    seed: int = seed_option()

    # recompute (relax/trainer/recompute.py)
    recompute_granularity: str | None = option(
        None, "full: the decoder layers' activations are not kept for the backward pass; "
        "each recomputed layer keeps its input hidden state and runs its forward again in "
        "the backward (about one more forward pass of the policy per update). Turn it on "
        "when activations dominate peak memory: long responses, large micro-batches "
        "(--micro-batch-size, --max-tokens-per-gpu). Only the update's forward with "
        "autograd is affected. selective is rejected: Megatron's selective recomputes the "
        "core attention's softmax, which the SDPA/flash attention of Hugging Face decoder "
        "layers never stores.", default_note="off", group="recompute",
        choices=("full", "selective"))
    recompute_method: str | None = option(
        None, "Which layers --recompute-granularity full recomputes. uniform: all of them "
        "(each its own checkpoint; Megatron's chunks of --recompute-num-layers layers are "
        "not formed). block: only the first --recompute-num-layers layers of the stack.",
        default_text="uniform", group="recompute", choices=("uniform", "block"))
    recompute_num_layers: int | None = option(
        None, "N >= 1, at most the model's decoder layers: with --recompute-method block "
        "the first N layers are recomputed, the rest not; with uniform Megatron's chunk "
        "size (checked, no effect here: every layer is recomputed).",
        default_text="1 with uniform; block needs it", group="recompute")

    # modes
    colocate: bool = option(
        True, "Rollout then train on the same devices; accepted, it is the only "
        "mode.", group="modes")
    fully_async: bool = option(
        False, "Sample and score on --rollout-num-gpus ranks of their own while "
        "the other ranks train, with a fixed lag of --max-staleness steps "
        "(relax/trainer/async_layout.py); rejected for the REINFORCE++ variants, whose "
        "normalization needs a closed synchronous global batch (reinforce_plus_plus.md §8).",
        group="modes")
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
        default_text="a known GPU's data sheet, else the best of square matmuls in the run's "
        "dtype measured at start-up and at every step", group="modes")
    bf16: bool | None = bf16_option()
    device: str = device_option()
    host_mmap_threshold_kb: int = host_mmap_threshold_kb_option()

    # rollout backend (relax/config/rollout_backend.py)
    rollout_backend: str = rollout_backend_option()
    vllm_url: list | None = vllm_url_option()
    vllm_startup_timeout: float = vllm_startup_timeout_option()
    vllm_request_timeout: float = vllm_request_timeout_option()

    # evaluation
    eval_interval: int | None = option(
        None, "Evaluate every N rollout steps and log "
        "eval/<name>/pass@k and eval/<name>/mean_reward.",
        default_note='no evaluation', group="evaluation")
    eval_prompt_data: list | None = eval_prompt_data_option()
    n_samples_per_eval_prompt: int = n_samples_per_eval_prompt_option()
    eval_temperature: float | None = eval_temperature_option()
    eval_top_p: float | None = eval_top_p_option()
    eval_top_k: int | None = eval_top_k_option()
    eval_max_response_len: int | None = eval_max_response_len_option()
    eval_batch_size: int = eval_batch_size_option()
    eval_pass_threshold: float = eval_pass_threshold_option()

    # environments
    env: str | None = env_option()
    max_turns: int = max_turns_option()
    env_step_timeout: float | None = env_step_timeout_option()
    eval_episodes: int = eval_episodes_option()
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

    # rewards (relax/config/reward_services.py)
    rm_url: str | None = rm_url_option()
    reward_max_concurrency: int = reward_max_concurrency_option()
    rm_batch_size: int = rm_batch_size_option()
    rm_retries: int = rm_retries_option()
    rm_retry_backoff: float = rm_retry_backoff_option()
    group_rm: bool = group_rm_option()
    genrm_model_path: str | None = genrm_model_path_option()
    genrm_prompt_template: str | None = genrm_prompt_template_option()
    genrm_max_response_len: int = genrm_max_response_len_option()

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
        30.0, "Seconds per sample a reward function may take; with --rm-url, one request as "
        "a whole (docs/reliability.md).", group="run")
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
    def recompute(self) -> RecomputeSection:
        return RecomputeSection.of(self)

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
    eval_prompt_data: list | None = eval_prompt_data_option()
    n_samples_per_eval_prompt: int = n_samples_per_eval_prompt_option()
    eval_temperature: float | None = eval_temperature_option()
    eval_top_p: float | None = eval_top_p_option()
    eval_top_k: int | None = eval_top_k_option()
    eval_max_response_len: int | None = eval_max_response_len_option()
    eval_batch_size: int = eval_batch_size_option()
    eval_pass_threshold: float = eval_pass_threshold_option()
    input_key: str = input_key_option()
    label_key: str = label_key_option()
    rm_type: str | None = rm_type_option()
    custom_rm_path: str | None = custom_rm_path_option()
    apply_chat_template: bool = apply_chat_template_option()
    system_prompt: str | None = system_prompt_option()
    reasoning_gym_answer: str = reasoning_gym_answer_option()
    builtin_task: str | None = builtin_task_option()
    seed: int = seed_option()
    bf16: bool | None = bf16_option()
    device: str = device_option()
    host_mmap_threshold_kb: int = host_mmap_threshold_kb_option()
    env: str | None = env_option()
    max_turns: int = max_turns_option()
    env_step_timeout: float | None = env_step_timeout_option()
    eval_episodes: int = eval_episodes_option()
    rollout_backend: str = rollout_backend_option("eval")
    vllm_url: list | None = vllm_url_option("evaluation")
    vllm_startup_timeout: float = vllm_startup_timeout_option("evaluation")
    vllm_request_timeout: float = vllm_request_timeout_option("evaluation")
    output_dir: str | None = option(
        None, "Also write the metrics to OUTPUT_DIR/eval_metrics.json (and, with "
        "--rollout-backend vllm, the server's log).", group="evaluation")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @cached_property
    def evaluation(self) -> EvaluationSection:
        """The evaluation section ``relax train`` has too (relax/config/sections.py)."""
        return EvaluationSection.of(self)
