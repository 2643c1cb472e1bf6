"""The sections of the run around the algorithm and the rollout: the model, batch sizes, the
optimizer, LoRA, activation recompute, evaluation, checkpoints, the run's outputs and the
system (devices, precision, sharding). Each field carries its flag, default, help and bound.
Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import reject
from relax.config.section import Section, option

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ModelSection(Section):
    """The policy's and the reference's weights."""

    hf_checkpoint: str | None = option(
        None,
        'Hugging Face model directory (with config.json).',
        default_text='built-in tiny model')
    ref_load: str | None = option(
        None,
        'Reference model directory; only with a KL (--kl-coef or --use-kl-loss).',
        default_text='the initial policy weights')


@dataclass(frozen=True)
class BatchSection(Section):
    """Sizes in prompts and samples (responses), micro-batching and dynamic sampling."""

    rollout_batch_size: int = option(
        8,
        'Prompts per rollout step; a multiple of WORLD_SIZE.',
        bound=(lambda v: v >= 1, "must be >= 1 prompts per rollout step"))
    samples_per_prompt: int = option(
        1,
        'Responses per prompt (a group); > 1 for reinforce_plus_plus_baseline '
        '(reinforce_plus_plus.md §8).',
        flag='n_samples_per_prompt',
        bound=(lambda v: v >= 1, "must be >= 1 responses per prompt"))
    global_batch_size: int | None = option(
        None,
        'Samples per optimizer step; divides the rollout samples, multiple of WORLD_SIZE x '
        "--micro-batch-size (reinforce_plus_plus.md §7: one step's loss).",
        default_text='rollout samples (one optimizer step per rollout)',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 samples per step"))
    micro_batch_size: int | None = option(
        None,
        'Samples per forward/backward per rank.',
        default_text='global batch / WORLD_SIZE',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 samples per rank"))
    token_budget: bool = option(
        False,
        'Token-budget micro-batches of at most --max-tokens-per-gpu tokens (instead of '
        '--micro-batch-size rows): packed passes take rows in order while their lengths fit; '
        '--pass-layout padded groups rows by length and counts padded slots. The loss is the '
        'same (reinforce_plus_plus.md §7).',
        flag='use_dynamic_batch_size')
    max_tokens_per_gpu: int | None = option(
        None,
        'Tokens (prompt + response; padded slots with --pass-layout padded) per micro-batch of'
        ' the update.',
        default_text='none; required by --use-dynamic-batch-size')
    log_probs_max_tokens_per_gpu: int | None = option(
        None,
        'The same budget for the no-grad old and reference log-prob passes (no activations '
        'kept, so it can be larger).',
        default_text='--max-tokens-per-gpu')
    pass_layout: str = option(
        'shared-prefix',
        'How the old-policy, reference and update passes lay out a micro-batch. shared-prefix:'
        ' its rows as one sequence without padding, attention within each row, the samples of '
        "a prompt sharing one copy of it (log-probs and gradients equal the padded passes'); "
        'packed: the same, every row with its own prompt; padded: every row padded to the '
        'longest of its micro-batch. Llama and Qwen3 models pack; other models, and rows whose'
        ' attention has holes, run padded. With shared-prefix the generative judge\'s'
        ' (--rm-type genrm) prefill also shares the beginning of a prompt\'s judging prompts.',
        choices=('shared-prefix', 'packed', 'padded'))
    steps_per_rollout: int | None = option(
        None,
        'Optimizer steps per rollout step; alone it sets the global batch.',
        flag='num_steps_per_rollout',
        default_text='rollout samples / global batch',
        bound=(lambda v: v is None or v >= 1, "must be >= 1"))
    num_rollout: int | None = option(
        None,
        'Rollout steps to run; required without --prompt-data.',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 rollout steps"))
    num_epoch: int | None = option(
        None,
        'Passes over --prompt-data when --num-rollout is not given.',
        default_text='1',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 passes over --prompt-data"))
    filter_path: str | None = option(
        None,
        'DAPO-style dynamic sampling: a group filter, nonzero_std (keep groups whose rewards '
        "are not all equal) or 'module:function' / 'file.py:function' (rewards, responses, "
        'label) -> bool. Prompts are generated in rounds until --rollout-batch-size groups '
        'pass; the step trains on those only.',
        flag='dynamic_sampling_filter_path',
        default_text='off')
    over_sampling_batch_size: int | None = option(
        None,
        'Prompts generated per dynamic-sampling round; >= --rollout-batch-size, a multiple of '
        'WORLD_SIZE.',
        default_text='--rollout-batch-size')
    max_rounds: int = option(
        8,
        'Bound on the dynamic-sampling rounds of one rollout step; when it is reached the step'
        ' trains on the groups that passed (rollout/groups_trained), or skips the update when '
        'none did.',
        flag='dynamic_sampling_max_rounds')


@dataclass(frozen=True)
class OptimizerSection(Section):
    """AdamW, constant learning rate."""

    lr: float = option(
        1e-06,
        'Learning rate > 0.',
        bound=(lambda v: v > 0.0, "must be > 0, e.g. 1e-6"))
    weight_decay: float = option(
        0.0,
        'AdamW weight decay.',
        bound=(lambda v: v >= 0.0, "must be >= 0"))
    adam_beta1: float = option(
        0.9,
        'AdamW beta1.',
        bound=(lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.9"))
    adam_beta2: float = option(
        0.999,
        'AdamW beta2.',
        bound=(lambda v: 0.0 <= v < 1.0, "must lie in [0, 1); the default is 0.999"))
    clip_grad: float = option(
        1.0,
        'Gradient-norm clip > 0.',
        bound=(lambda v: v > 0.0, "must be > 0 (gradient-norm clip); the default is 1.0"))


@dataclass(frozen=True)
class LoraSection(Section):
    """Low-rank adapters (peft) instead of full fine-tuning; ``rank`` 0 is full fine-tuning."""

    rank: int = option(
        0,
        'LoRA rank R: train low-rank adapters (peft) on --lora-target-modules instead of the '
        'weights; the reference is the same model with the adapter off.',
        flag='lora_rank',
        default_note='off: full fine-tuning')
    alpha: float = option(
        16.0,
        'LoRA scaling alpha (the update is scaled by alpha / R).',
        flag='lora_alpha')
    dropout: float = option(
        0.0,
        "Dropout on the adapter's input, in [0, 1).",
        flag='lora_dropout')
    target_modules: tuple | None = option(
        None,
        "Hugging Face module names, or Relax's Megatron names linear_qkv linear_proj "
        'linear_fc1 linear_fc2.',
        flag='lora_target_modules',
        nargs='+',
        metavar='NAME',
        default_text='every linear layer of the blocks (q_proj k_proj v_proj o_proj gate_proj up_proj '
        'down_proj)')

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class RecomputeSection(Section):
    """Activation recompute of the policy's training forward (relax/trainer/recompute.py):
    less memory for one more forward of the recomputed layers (Megatron's flag names);
    ``granularity`` None is off."""

    granularity: str | None = option(
        None,
        "full: the decoder layers' activations are not kept for the backward pass; each "
        'recomputed layer keeps its input hidden state and runs its forward again in the '
        'backward (about one more forward pass of the policy per update). Turn it on when '
        'activations dominate peak memory: long responses, large micro-batches '
        "(--micro-batch-size, --max-tokens-per-gpu). Only the update's forward with autograd "
        "is affected. selective is rejected: Megatron's selective recomputes the core "
        "attention's softmax, which the SDPA/flash attention of Hugging Face decoder layers "
        'never stores.',
        flag='recompute_granularity',
        choices=('full', 'selective'),
        default_note='off')
    method: str | None = option(
        None,
        'Which layers --recompute-granularity full recomputes. uniform: all of them (each its '
        "own checkpoint; Megatron's chunks of --recompute-num-layers layers are not formed). "
        'block: only the first --recompute-num-layers layers of the stack.',
        flag='recompute_method',
        choices=('uniform', 'block'),
        default_text='uniform')
    num_layers: int | None = option(
        None,
        "N >= 1, at most the model's decoder layers: with --recompute-method block the first N"
        " layers are recomputed, the rest not; with uniform Megatron's chunk size (checked, no"
        ' effect here: every layer is recomputed).',
        flag='recompute_num_layers',
        default_text='1 with uniform; block needs it')

    @property
    def enabled(self) -> bool:
        return self.granularity is not None

    def check(self) -> None:
        """Its own rules; the layer count is checked when the model is loaded."""
        super().check()
        if self.granularity == "selective":
            reject(self, "recompute_granularity", "not available: Megatron's selective "
                   "recompute rebuilds the core attention's softmax, which the SDPA/flash "
                   "attention of Hugging Face decoder layers never stores; use full (with "
                   "--recompute-method block --recompute-num-layers N to recompute only N "
                   "layers)")
        for dest, value in (("recompute_method", self.method),
                            ("recompute_num_layers", self.num_layers)):
            if value is not None and self.granularity != "full":
                reject(self, dest, "has no effect without --recompute-granularity full; add "
                       "it or remove this flag")
        if self.num_layers is not None and self.num_layers < 1:
            reject(self, "recompute_num_layers", "must be >= 1 (decoder layers)")
        if self.method == "block" and self.num_layers is None:
            reject(self, "recompute_method", "block recomputes the first N layers; give "
                   "--recompute-num-layers N")


@dataclass(frozen=True)
class EvaluationSection(Section):
    """Evaluation as ``relax train --eval-interval`` and ``relax eval`` share it: pass@k
    (unbiased) and mean reward on held-out prompts or ``--env`` seeds; the sampling follows
    the rollout's where its flag is not given (relax/config/eval_flags.py)."""

    interval: int | None = option(
        None,
        'Evaluate every N rollout steps and log eval/<name>/pass@k and '
        'eval/<name>/mean_reward.',
        flag='eval_interval',
        default_note='no evaluation')
    prompt_data: tuple | None = option(
        None,
        'PATH, or NAME PATH pairs, of .jsonl/.parquet prompt files or reasoning-gym:NAME '
        "sources; fields --input-key / --label-key, scored with the run's reward.",
        flag='eval_prompt_data',
        nargs='+',
        metavar='[NAME] PATH',
        default_text="the built-in task's fixed evaluation prompts")
    n_samples: int = option(
        1,
        'Responses per evaluation prompt; pass@k is logged for k = 1, 2, 4, ... up to this '
        'number.',
        flag='n_samples_per_eval_prompt',
        bound=(lambda v: v >= 1, "must be >= 1 responses per prompt"))
    temperature: float | None = option(
        None,
        'Sampling temperature >= 0; 0 is greedy.',
        flag='eval_temperature',
        default_text="in relax train the rollout's temperature, in relax eval 1.0",
        bound=(lambda v: v is None or v >= 0.0, "must be >= 0 (0 is greedy decoding)"))
    top_p: float | None = option(
        None,
        'Nucleus sampling mass in (0, 1].',
        flag='eval_top_p',
        default_text="in relax train the rollout's top-p, in relax eval 1.0",
        bound=(lambda v: v is None or 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 to turn it off"))
    top_k: int | None = option(
        None,
        'Top-k sampling, >= 1 or -1.',
        flag='eval_top_k',
        default_text="in relax train the rollout's top-k, in relax eval -1 (off)",
        bound=(lambda v: v is None or v == -1 or v >= 1, "must be >= 1, or -1 to turn top-k off"))
    max_response_len: int | None = option(
        None,
        'Maximum generated tokens per evaluation response.',
        flag='eval_max_response_len',
        default_text="in relax train the rollout's maximum response length, in relax eval 1024 (the "
        "preset's for the built-in task)",
        bound=(lambda v: v is None or v >= 1, "must be >= 1 tokens"))
    batch_size: int = option(
        64,
        'Sequences (prompts x samples) per generation call.',
        flag='eval_batch_size',
        bound=(lambda v: v >= 1, "must be >= 1 sequences per generation call"))
    pass_threshold: float = option(
        1.0,
        'A response passes (counts for pass@k) when its reward is >= this.',
        flag='eval_pass_threshold')
    episodes: int = option(
        64,
        'With --env: episodes of the held-out environment seeds 1000000000, 1000000001, ... an'
        ' evaluation plays (--n-samples-per-eval-prompt plays each); an episode passes when '
        'its reward is >= --eval-pass-threshold.',
        flag='eval_episodes',
        bound=(lambda v: v >= 1, "must be >= 1 episodes"))


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Where and when checkpoints are written and read (docs/reliability.md)."""

    save: str | None = option(
        None,
        'Checkpoint directory.',
        default_note='no checkpoints', writes='save')
    load: str | None = option(
        None,
        'Checkpoint directory to resume from.')
    save_interval: int | None = option(
        None,
        'Rollout steps between checkpoints; needs --save.',
        default_text='only at the end',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 rollout steps"))
    keep_last: int | None = option(
        None,
        'Keep only the newest K interval checkpoints; needs --save.',
        default_text='keep all',
        bound=(lambda v: v is None or v >= 1, "must be >= 1 checkpoints"))
    async_save: bool = option(
        False,
        'Write each interval checkpoint on a background thread while the next rollout step '
        'runs; a checkpoint counts only once completely written (docs/reliability.md).')
    checksums: bool = option(
        False,
        'Record the SHA-256 of every checkpoint file when saving and compare it at --load '
        '(reads every byte of the checkpoint).',
        flag='checkpoint_checksums',
        default_note='file sizes only')


@dataclass(frozen=True)
class RunSection(Section):
    """The run's outputs, seed, logging and wall-clock budget."""

    output_dir: str | None = option(
        None,
        'Gets config.json and the metrics.',
        default_text='runs/<estimator>-<YYYYmmdd-HHMMSS>', writes='output')
    seed: int = option(
        1234,
        'Seed of every RNG.',
        bound=(lambda v: 0 <= v < 2**32, "must lie in [0, 2**32)"))
    exit_duration_in_mins: float | None = option(
        None,
        'A wall-clock budget: after the first rollout step that ends this many minutes after '
        'relax train started, evaluate (with --eval-interval) and save (with --save) as at the'
        ' last step, then exit 0. Resuming with --load continues the remaining steps on a '
        'fresh budget.')
    distributed_timeout_minutes: float = option(
        10.0,
        'Collective timeout: a rank that waits longer for its peers exits with an error.',
        bound=(lambda v: 0.0 < v <= 10080.0, "must lie in (0, 10080] minutes (one week); the default is 10"))
    log_samples: int = option(
        4,
        'Samples per rollout step appended to OUTPUT_DIR/samples.jsonl (prompt, response, '
        'reward, label); 0 turns it off.')
    use_tensorboard: bool = option(
        False,
        'Also write TensorBoard event files.')
    use_wandb: bool = option(
        False,
        'Also log to Weights & Biases (needs wandb).')
    dry_run: bool = option(
        False,
        'Validate, print the resolved configuration as JSON, exit 0 without loading a model or'
        ' data.')


@dataclass(frozen=True)
class SystemSection(Section):
    """Devices, precision, sharding and host memory."""

    fsdp: bool = option(
        False,
        'Shard parameters with FSDP2 fully_shard.',
        default_note='DDP replication')
    context_parallel_size: int = option(
        1,
        'Values other than 1 are rejected (reinforce_plus_plus.md §8, 9).')
    bf16: bool | None = option(
        None,
        'Forward passes under bf16 autocast; fp32 master weights, AdamW state and log-prob '
        'math; reference stored in bf16.',
        default_text='on with CUDA, off on the CPU')
    device: str = option(
        'auto',
        '',
        choices=DEVICES,
        default_note='cuda when available, else cpu')
    peak_tflops: float | None = option(
        None,
        'Peak TFLOP/s per rank that perf/*_mfu divides by.',
        default_text="a known GPU's data sheet, else the best of square matmuls in the run's dtype measured"
        ' at start-up and at every step',
        bound=(lambda v: v is None or v > 0.0, "must be > 0 TFLOP/s, e.g. 989 for an " "H100's bf16 dense peak; leave it out to measure"))
    host_mmap_threshold_kb: int = option(
        0,
        'Host (CPU) memory blocks of at least this many KiB get their own memory map and go '
        "back to the OS when freed (glibc's M_MMAP_THRESHOLD, fixed; relax/host_memory.py). "
        "Turn it on (128) when host memory binds: glibc's dynamic threshold keeps freed "
        "tensors in a fragmenting heap, so a CPU run's peak RSS can be twice its live tensors;"
        ' a fixed one trades that for page faults (SmolLM2, 16 x 256 with recompute: peak 6.2 '
        "-> 3.3 GiB, step time +20-27 percent; docs/performance.md). 0: glibc's dynamic one.",
        default_note="glibc's dynamic threshold")
