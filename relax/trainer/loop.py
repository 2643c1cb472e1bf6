"""The synchronous colocate loop (reinforce_plus_plus.md §9): one closed global batch per rollout step.

    for each rollout step:
        batch     = collect(step)                 whole prompt groups per data-parallel rank:
                    prompts = sample_prompts(...)     the next prompts of the stream
                    rollout = generate(prompts)       current policy, KV cache, stop at EOS / length
                    rewards = score(prompts, rollout) math, a built-in task, or --custom-rm-path
                    (in rounds, keeping the groups the --dynamic-sampling-filter-path passes;
                    with --env / --use-agentic-rollout: play_episodes(step) instead)
        exp       = old_and_ref_log_probs(...)    training model / frozen reference, no autograd
        exp       = advantages(exp, rewards)      compute_advantages_and_returns over the DP group
        history   = update(exp)                   --num-steps-per-rollout AdamW steps (reinforce_plus_plus.md §7)
        log(metrics); save(step); stop here if SIGTERM/SIGINT arrived

Launch: ``relax train [flags]`` or ``torchrun --nproc_per_node N -m relax train [flags]``.

Metrics per rollout step (rank 0 writes ``OUTPUT_DIR/metrics.jsonl``): the reinforce_plus_plus.md §10
names, ``perf/step_time`` = ``perf/rollout_time`` (generate + reward) + ``perf/train_time``
(log_prob + advantage + update) with each phase's own ``perf/<phase>_time`` (slowest rank),
``perf/generated_tokens_per_s`` (global tokens / rollout time), ``perf/peak_memory_gb`` and
``perf/backward_skipped_fraction`` (share of the step's samples whose backward was skipped
because their loss and gradient are exactly zero, ``relax.trainer.update.inert_rows``), and
the distance to the machine's limit: ``perf/mfu``, ``perf/update_mfu``, ``perf/log_prob_mfu``
(model FLOPs over time and the peak) and ``perf/generate_bandwidth_fraction``
(relax/trainer/flops.py).
Exit status of :func:`train`: 0, 2 for bad input, 1 for a failure during training, 128 + the
signal number when SIGTERM/SIGINT stopped the run (after a checkpoint with ``--save``).
Guarantees and the tests behind them: docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from relax.algorithms import AdvantageSettings, compute_advantages_and_returns
from relax.collectives import all_reduce, seed_for
from relax.errors import InputError, Interrupted, PeerFailure, RelaxError, RewardError
from relax.eval.hook import load_eval_sets, maybe_evaluate
from relax.metrics.sinks import build_logger, spread_indices
from relax.metrics.tracker import MetricTracker
from relax.precision import autocast, use_bf16
from relax.rollout.data import (
    PromptSource,
    check_formatted_lengths,
    format_prompt,
    load_source,
    report_overlap,
)
from relax.rollout.filters import kept_groups, load_group_filter
from relax.rollout.generate import generate, tokenize_prompts
from relax.rollout.reasoning_gym_source import is_reasoning_gym
from relax.rollout.rewards import (
    build_reward_fn,
    call_plugin,
    load_function,
    score_with_errors,
)
from relax.rollout.tasks import get_task
from relax.rundirs import check_free_space
from relax.trainer import checkpoint, setup
from relax.trainer.distributed import (
    exit_rank,
    finish_together,
    init_distributed,
    is_peer_failure,
    raise_together,
    reshard,
    shutdown_distributed,
    unwrap,
    wrap_model,
)
from relax.trainer.episode_rollout import EpisodeSource
from relax.trainer.flops import ModelShape, measure_bandwidth, measure_peak_flops, phase_metrics
from relax.trainer.logprobs import batched_log_probs, experience_from_rollout
from relax.trainer.lora import ALL_LINEAR, adapter_disabled, add_lora
from relax.trainer.resume import check_resume
from relax.trainer.runtime import Timer, peak_memory_gb, rows_after
from relax.trainer.signals import StopRequest
from relax.trainer.step_batch import StepBatch, kept_batch
from relax.trainer.update import LossSettings, train_on_rollout


class Trainer:
    """Holds the models, data and sinks of one run; ``fit()`` is the loop of the docstring."""

    def __init__(self, cfg, ctx, *, console: bool = True, stop: StopRequest | None = None):
        self.cfg, self.ctx = cfg, ctx
        self.started = time.monotonic()  # --exit-duration-in-mins counts from here
        self.ended_early: str | None = None
        self.stop = stop or StopRequest()
        self.timer = Timer(ctx.device)
        self.bf16 = use_bf16(cfg.bf16, ctx.device)
        # everything that can fail on bad input comes before any model is loaded
        resume = self._check_paths()
        self._build_data_and_rewards()
        if resume:
            changed = check_resume(cfg, resume[0], resume[1], self.total_steps)
            if changed and ctx.is_main:
                print(changed, file=sys.stderr)
        # a bad evaluation file fails here, before any model is loaded
        # (--env evaluates on held-out environment seeds instead: relax/eval/episodes.py)
        self.eval_sets = load_eval_sets(cfg) if cfg.eval_interval and not cfg.env else []
        if self.samples is not None and ctx.is_main:
            report_overlap(self.samples, self.eval_sets,
                           report=lambda line: print(line, file=sys.stderr))
        self._build_models(resume)
        if ctx.device.type == "cpu":
            # the host's cores shared between the local ranks (setup.cpu_threads)
            torch.set_num_threads(setup.cpu_threads(
                local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        if ctx.is_main:
            checkpoint.remove_stale_temps(cfg.save)
        self.checkpointer = checkpoint.Checkpointer(
            cfg.save, ctx, fsdp=cfg.fsdp, async_save=cfg.async_save,
            checksums=cfg.checkpoint_checksums, keep_last=cfg.keep_last, lora=self.lora,
            base=cfg.hf_checkpoint) if cfg.save else None
        self.tracker = MetricTracker(ctx.group, ctx.device)
        self.logger = build_logger(
            is_main=ctx.is_main, output_dir=cfg.output_dir, total_steps=self.total_steps,
            start_step=self.start_step, console=console, tensorboard=cfg.use_tensorboard,
            wandb=cfg.use_wandb, config=cfg.to_dict(), samples=cfg.log_samples > 0,
        )

    def _check_paths(self) -> tuple[str, int] | None:
        """Model directories, ``--save`` and ``--load``; returns the checkpoint to resume."""
        cfg = self.cfg
        setup.check_model_paths(cfg)
        checkpoint.check_save_dir(cfg.save)
        if not cfg.load:
            return None
        if not os.path.isdir(cfg.load):
            raise InputError(f"--load {cfg.load}: no such directory")
        resume = checkpoint.latest_checkpoint(cfg.load, report=self.ctx.is_main,
                                              checksums=cfg.checkpoint_checksums)
        if resume is None:
            raise InputError(f"--load {cfg.load}: no complete Relax checkpoint in it")
        return resume

    def _build_data_and_rewards(self) -> None:
        cfg = self.cfg
        samples = task = None
        # environments are built here, before any model, so bad input stops the run early
        self.episodes = (EpisodeSource(cfg, self.ctx) if cfg.env or cfg.use_agentic_rollout
                         else None)
        if cfg.prompt_data:
            samples = load_source(cfg.prompt_data, "--prompt-data", cfg, role="train")
        elif not cfg.env:  # an environment makes its own prompts
            task = get_task(cfg.builtin_task)
        self.samples = samples
        # a built-in task scores with its own reward unless told otherwise
        rm_type = cfg.rm_type or (None if samples is not None else cfg.builtin_task)
        self.reward_fn, self.reward_name = build_reward_fn(
            cfg.custom_rm_path, rm_type,
            gym_answer=cfg.reasoning_gym_answer if is_reasoning_gym(cfg.prompt_data) else None)
        self.post_process = self.custom_advantage = None
        if cfg.custom_reward_post_process_path:
            self.post_process = load_function(cfg.custom_reward_post_process_path,
                                              "--custom-reward-post-process-path")
        if cfg.custom_advantage_function_path:
            self.custom_advantage = load_function(cfg.custom_advantage_function_path,
                                                  "--custom-advantage-function-path")
        self.group_filter = (load_group_filter(cfg.dynamic_sampling_filter_path)
                             if cfg.dynamic_sampling_filter_path else None)
        if cfg.world_size != self.ctx.world_size:  # validation's batch rules assumed its own
            raise InputError(f"the configuration was resolved for WORLD_SIZE={cfg.world_size} but "
                             f"this run has {self.ctx.world_size} data-parallel ranks; parse the "
                             "flags under this launch (parse_train_config reads WORLD_SIZE)")
        self.source = PromptSource(batch_size=cfg.rollout_batch_size, seed=cfg.seed,
                                   samples=samples, task=task, shuffle=cfg.rollout_shuffle)
        self.total_steps = cfg.num_rollout or cfg.num_epoch * self.source.steps_per_epoch
        self.settings = AdvantageSettings(
            estimator=cfg.advantage_estimator, normalize_advantages=cfg.normalize_advantages,
            gamma=cfg.gamma, kl_coef=cfg.kl_coef,
            std_normalization=not cfg.disable_grpo_std_normalization,
        )
        self.loss_settings = LossSettings.from_config(cfg, bf16=self.bf16)

    def _build_models(self, resume) -> None:
        cfg, ctx = self.cfg, self.ctx
        setup.quiet_transformers()  # no download/shard progress bars between summary lines
        self.tokenizer = setup.load_tokenizer(cfg.hf_checkpoint)
        if cfg.apply_chat_template and not getattr(self.tokenizer, "chat_template", None):
            raise InputError(f"--apply-chat-template: the tokenizer in {cfg.hf_checkpoint} has "
                             "no chat template; remove the flag or use a chat model")
        # a resumed run starts from the same model; the checkpoint's state replaces its weights
        policy = setup.load_policy(cfg.hf_checkpoint, self.tokenizer, ctx.device, seed=cfg.seed)
        self.eos_ids = setup.eos_token_ids(self.tokenizer, policy)
        self._check_prompt_lengths(policy)
        self._measure_limits(policy)
        self.lora = None
        if cfg.lora_rank:
            self.lora = add_lora(policy, rank=cfg.lora_rank, alpha=cfg.lora_alpha,
                                 dropout=cfg.lora_dropout,
                                 targets=cfg.lora_target_modules or list(ALL_LINEAR),
                                 seed=seed_for(cfg.seed, "lora"))
        # the reference is the initial weights (or --ref-load), also when resuming; with LoRA
        # the initial weights are the policy with its adapter switched off
        self.ref = (setup.load_reference(cfg, self.tokenizer, ctx.device, bf16=self.bf16)
                    if setup.needs_reference(cfg) and not (self.lora and not cfg.ref_load)
                    else None)
        self.has_reference = setup.needs_reference(cfg)
        if ctx.is_main:
            check_free_space(cfg.save, sum(p.numel() for p in policy.parameters()
                                           if p.requires_grad))
        self.model = wrap_model(policy, ctx, fsdp=cfg.fsdp)
        self.optimizer = setup.build_optimizer(self.model, cfg)
        self.start_step, self.resumed_from, self.cursor = 0, None, 0
        if resume:
            progress = checkpoint.load_trainer_state(resume[0], self.model, self.optimizer,
                                                     fsdp=cfg.fsdp, ctx=ctx,
                                                     trainable_only=self.lora is not None)
            self.start_step, self.resumed_from = resume[1], resume[0]
            self._check_progress(progress)

    def _measure_limits(self, policy) -> None:
        """The model's FLOP counts and this device's peak (``--peak-tflops`` or measured) and
        copy bandwidth, for ``perf/*_mfu`` (relax/trainer/flops.py)."""
        self.shape = ModelShape.of(policy)
        device = self.ctx.device
        self.peak_flops = (self.cfg.peak_tflops * 1e12 if self.cfg.peak_tflops
                           else measure_peak_flops(device, self.bf16))
        self.bandwidth = measure_bandwidth(device)

    def _check_prompt_lengths(self, policy) -> None:
        """Training and evaluation prompts must fit the model context with a full response
        (else the prompt's file:line, or its evaluation set and number)."""
        cfg = self.cfg
        context = getattr(policy.config, "max_position_embeddings", None)
        fmt = dict(apply_chat_template=cfg.apply_chat_template, system_prompt=cfg.system_prompt)
        if self.samples is not None:
            check_formatted_lengths(self.tokenizer, self.samples, **fmt, context=context,
                                    max_response=cfg.rollout_max_response_len)
        for eval_set in self.eval_sets:
            check_formatted_lengths(self.tokenizer, eval_set.as_samples(), **fmt,
                                    context=context, max_response=cfg.eval_max_response_len,
                                    length_flag="--eval-max-response-len")

    def _check_progress(self, progress: dict) -> None:
        """Continue the prompt stream where the checkpoint left it; say where the resumed run
        stands; warn when the data position no longer matches."""
        step = self.start_step
        saved = progress.get("data")
        self.cursor = (saved or {}).get("cursor", step * self.cfg.rollout_batch_size)
        if not self.ctx.is_main:
            return
        now = self.source.position_at(self.cursor)
        if saved is not None:
            saved = {k: saved[k] for k in ("epoch", "index") if k in saved}
        if self.group_filter is None and self.cursor != step * self.cfg.rollout_batch_size:
            now = self.source.position(step)  # another --rollout-batch-size: warn below
        print(f"relax train: resuming from {self.resumed_from} at rollout step {step} "
              f"(data epoch {now['epoch']}, prompt {now['index']} of the epoch)",
              file=sys.stderr)
        stale = rows_after(os.path.join(self.cfg.output_dir, "metrics.jsonl"), step)
        if stale:
            print(f"relax train: {os.path.join(self.cfg.output_dir, 'metrics.jsonl')} holds "
                  f"{stale} rows of steps after {step} from the interrupted run; the rows this "
                  "run appends supersede them (readers keep the last row of each step)",
                  file=sys.stderr)
        if saved is not None and saved != now:
            print(f"relax train: warning: the checkpoint was at data position {saved}, this "
                  f"configuration puts step {step} at {now} (--rollout-batch-size or the data "
                  "changed?); the run is no longer an exact continuation", file=sys.stderr)

    # ------------------------------------------------------------------ phases
    def sample_prompts(self, cursor: int, count: int):
        """This rank's whole groups of the ``count`` prompts at stream position ``cursor``:
        prompts, labels, group_index [B] (local ids)."""
        per_rank = count // self.ctx.world_size
        batch = self.source.take(cursor + self.ctx.rank * per_rank, per_rank)
        n = self.cfg.n_samples_per_prompt
        texts = [format_prompt(self.tokenizer, s.prompt, apply_chat_template=self.cfg.
                               apply_chat_template, system_prompt=self.cfg.system_prompt)
                 for s in batch]
        prompts = [t for t in texts for _ in range(n)]
        labels = [s.label for s in batch for _ in range(n)]
        group_index = torch.arange(len(batch), device=self.ctx.device).repeat_interleave(n)
        return prompts, labels, group_index

    def _generator(self, step: int, round_: int = 0) -> torch.Generator:
        generator = torch.Generator(self.ctx.device)
        extra = (round_,) if round_ else ()  # round 0 draws what a run without rounds draws
        generator.manual_seed(seed_for(self.cfg.seed, "rollout", self.ctx.rank, step, *extra))
        return generator

    def generate(self, prompts: list[str], step: int, round_: int = 0):
        ids, mask = tokenize_prompts(self.tokenizer, prompts, self.ctx.device)
        return self.sample(ids, mask, self.cfg.rollout_max_response_len,
                           self._generator(step, round_))

    def sample(self, ids, mask, max_new_tokens: int, generator):
        """One batched generation from left-padded ``ids`` / ``mask`` [B, P]."""
        model = unwrap(self.model)
        model.eval()
        with autocast(self.ctx.device, self.bf16):
            rollout = generate(
                model, ids, mask, max_new_tokens=max_new_tokens,
                eos_token_ids=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id,
                temperature=self.cfg.rollout_temperature, top_p=self.cfg.rollout_top_p,
                top_k=self.cfg.rollout_top_k, generator=generator,
                sync_group=self.ctx.group if self.cfg.fsdp else None,
                inference_mode=not self.cfg.fsdp,
            )
        model.train()
        if self.cfg.fsdp:
            reshard(self.model)
        return rollout

    def decode(self, rollout) -> list[str]:
        return self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

    def play_episodes(self, step: int):
        """``--env`` or ``--use-agentic-rollout``: this rank's episodes of ``step``
        (relax/rollout/episodes.py, relax/rollout/agent_server.py).

        Returns the :class:`StepBatch` the single-turn phases return (the transcripts as its
        responses), so the training phases are the same."""
        generator = self._generator(step)

        def sample(ids, mask, max_new_tokens):  # every turn of the step draws from one stream
            return self.sample(ids, mask, max_new_tokens, generator)

        eos = self.tokenizer.eos_token_id
        played, labels = self.episodes.play(
            step, sample, tracker=self.tracker, tokenizer=self.tokenizer,
            eos_token_id=self.eos_ids[0] if eos is None else eos,
            context=getattr(unwrap(self.model).config, "max_position_embeddings", None),
            prompts=self.source)
        n = self.cfg.n_samples_per_prompt
        rollout = played.rollout
        self.tracker.add_ratio("rollout/episode_turns", sum(played.turns), len(played.turns))
        group_index = torch.arange(len(played.turns) // n,
                                   device=self.ctx.device).repeat_interleave(n)
        rewards = torch.tensor(played.rewards, dtype=torch.float32, device=self.ctx.device)
        rewards = self._post_process(rewards, group_index)
        # samples.jsonl shows whole episodes: the environment's turns and the EOS that ends
        # each model turn included, the padding not
        transcripts = [self.tokenizer.decode(ids[keep].tolist(), skip_special_tokens=False)
                       for ids, keep in zip(rollout.response_ids, rollout.context_mask,
                                            strict=True)]
        return StepBatch(played.prompts, labels, group_index, rollout, transcripts, rewards,
                         rollout, rollout.response_ids.shape[1])

    def score(self, prompts, responses, labels, group_index) -> torch.Tensor:
        """Rewards [B] float32; a bad reward names its sample (global index over ranks)."""
        base = self.ctx.rank * len(prompts)
        values, error, failures = None, None, []
        try:
            values, failures = score_with_errors(
                self.reward_fn, prompts, responses, labels, name=self.reward_name,
                index_base=base, timeout=self.cfg.reward_timeout,
                policy=self.cfg.reward_error_policy)
        except RewardError as e:
            error = e
        raise_together(error, self.ctx)
        # --reward-error-policy zero: counted in rollout/reward_errors and printed, never silent
        self.tracker.add_sum("rollout/reward_errors", len(failures))
        prefix = f"[rank {self.ctx.rank}] " if self.ctx.world_size > 1 else ""
        for message in failures[:5]:  # a reward service that is down would flood the log
            print(f"relax train: warning: {prefix}{message}; scored 0 (--reward-error-policy "
                  "zero)", file=sys.stderr)
        if len(failures) > 5:
            print(f"relax train: warning: {prefix}{len(failures) - 5} more samples scored 0 in "
                  "this step (rollout/reward_errors counts them all)", file=sys.stderr)
        rewards = torch.tensor(values, dtype=torch.float32, device=self.ctx.device)
        return self._post_process(rewards, group_index)

    def _post_process(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        """``--custom-reward-post-process-path`` over rewards [B], checked; else unchanged."""
        if self.post_process is not None:
            flag = "--custom-reward-post-process-path"
            returned = call_plugin(self.post_process, flag, rewards.clone(), group_index.clone())
            try:
                out = torch.as_tensor(returned, dtype=torch.float32, device=self.ctx.device)
            except (TypeError, ValueError, RuntimeError, OverflowError) as e:
                raise RewardError(f"{flag} must return finite rewards of shape "
                                  f"{tuple(rewards.shape)}, got {type(returned).__name__}: "
                                  f"{e}") from None
            if out.shape != rewards.shape or not torch.isfinite(out).all():
                raise RewardError("--custom-reward-post-process-path must return finite "
                                  f"rewards of shape {tuple(rewards.shape)}")
            rewards = out
        return rewards

    def collect(self, step: int) -> StepBatch:
        """Generate and score this step's prompt groups: one round of --rollout-batch-size
        prompts, or with dynamic sampling rounds of --over-sampling-batch-size prompts until
        every rank holds its share of groups that pass the filter (or the round bound)."""
        cfg, t = self.cfg, self.timer
        rounds = cfg.dynamic_sampling_max_rounds if self.group_filter else 1
        count = cfg.over_sampling_batch_size if self.group_filter else cfg.rollout_batch_size
        quota = cfg.rollout_batch_size // self.ctx.world_size
        parts, kept = [], []  # every round's StepBatch; (round, group) of each kept group
        generated_groups = 0
        for r in range(rounds):
            prompts, labels, group_index = self.sample_prompts(self.cursor, count)
            self.cursor += count
            with t("generate"):
                rollout = self.generate(prompts, step, r)
            with t("reward"):
                responses = self.decode(rollout)
                rewards = self.score(prompts, responses, labels, group_index)
            part = StepBatch(prompts, labels, group_index, rollout, responses, rewards, rollout,
                             rollout.response_ids.shape[1])
            if self.group_filter is None:
                return part
            parts.append(part)
            n = cfg.n_samples_per_prompt
            generated_groups += len(prompts) // n
            kept += [(r, g) for g in kept_groups(self.group_filter, rewards.tolist(), responses,
                                                 labels, n)]
            # every rank runs the same rounds (lockstep generation, equal update sizes)
            short = torch.tensor([float(len(kept) < quota)], device=self.ctx.device)
            if not all_reduce(short, self.ctx.group, dist.ReduceOp.MAX).item():
                break
        return self._kept_batch(parts, kept, quota, generated_groups, rounds=r + 1)

    def _kept_batch(self, parts, kept, quota, generated_groups, *, rounds) -> StepBatch:
        """The first groups that passed the filter, as many on every rank: the quota, or the
        fewest any rank has when the round bound cut the sampling short."""
        n = self.cfg.n_samples_per_prompt
        have = torch.tensor([float(min(len(kept), quota))], device=self.ctx.device)
        k = int(all_reduce(have, self.ctx.group, dist.ReduceOp.MIN).item())
        self.tracker.add_sum("rollout/groups_generated", generated_groups)
        self.tracker.add_sum("rollout/groups_kept", len(kept))
        self.tracker.add_sum("rollout/groups_trained", k)
        self.tracker.add_max("rollout/sampling_rounds", rounds)
        self.tracker.add_ratio("rollout/filtered_fraction", generated_groups - len(kept),
                               generated_groups)
        all_rewards = torch.cat([p.rewards for p in parts])
        # rollout/raw_reward is the trained (kept) groups'; this one is every sample's
        self.tracker.add_ratio("rollout/generated_reward", all_rewards.sum(), len(all_rewards))
        if k < quota and self.ctx.is_main:
            print(f"relax train: warning: dynamic sampling kept {k} of {quota} groups per rank "
                  f"after {rounds} rounds (--dynamic-sampling-max-rounds); "
                  + ("training on those" if k else "no update this step"), file=sys.stderr)
        return kept_batch(parts, kept[:k], n, self.tokenizer.pad_token_id)

    def old_and_ref_log_probs(self, rollout):
        exp = experience_from_rollout(rollout)
        cfg = self.cfg
        budget = ((cfg.log_probs_max_tokens_per_gpu or cfg.max_tokens_per_gpu)
                  if cfg.use_dynamic_batch_size else None)
        common = dict(micro_batch_size=cfg.micro_batch_size, temperature=cfg.rollout_temperature,
                      bf16=self.bf16, max_tokens=budget, group=self.ctx.group)
        if setup.needs_old_log_probs(cfg):  # else the update uses its own (setup.py)
            exp.old_log_probs = batched_log_probs(unwrap(self.model), exp, **common,
                                                  inference_mode=not cfg.fsdp)
            if cfg.fsdp:
                reshard(self.model)
        if self.ref is not None:
            exp.ref_log_probs = batched_log_probs(self.ref, exp, **common)
        elif self.has_reference:  # LoRA: the policy with its adapter off is the reference
            with adapter_disabled(self.lora):
                exp.ref_log_probs = batched_log_probs(unwrap(self.model), exp, **common)
        return exp

    def advantages(self, exp, rewards, group_index):
        out = compute_advantages_and_returns(
            self.settings, rewards, exp.response_mask, group_index=group_index,
            old_log_probs=exp.old_log_probs, ref_log_probs=exp.ref_log_probs,
            group=self.ctx.group,
        )
        exp.advantages = out.advantages
        if self.custom_advantage is not None:
            flag = "--custom-advantage-function-path"
            returned = call_plugin(self.custom_advantage, flag, rewards, group_index,
                                   exp.response_mask)
            try:
                adv = torch.as_tensor(returned)
            except (TypeError, ValueError, RuntimeError, OverflowError) as e:
                raise RewardError(f"{flag} must return advantages of shape "
                                  f"{tuple(exp.response_mask.shape)}, got "
                                  f"{type(returned).__name__}: {e}") from None
            if adv.shape != exp.response_mask.shape:
                raise RewardError("--custom-advantage-function-path must return advantages of "
                                  f"shape {tuple(exp.response_mask.shape)}, got {tuple(adv.shape)}")
            exp.advantages = torch.where(exp.response_mask, adv.float(), 0.0)
        for name, value in out.metrics.items():
            self.tracker.add_global(name, value)
        return exp

    def update(self, exp):
        cfg, global_batch = self.cfg, self.cfg.global_batch_size
        if len(exp) * self.ctx.world_size < cfg.rollout_batch_size * cfg.n_samples_per_prompt:
            global_batch = len(exp) * self.ctx.world_size  # dynamic sampling came up short: one step
        history = train_on_rollout(
            self.model, self.optimizer, exp, self.loss_settings, self.ctx,
            global_batch_size=global_batch,
            micro_batch_size=cfg.micro_batch_size, clip_grad=cfg.clip_grad,
        )
        for values in history:
            for name, value in values.items():
                self.tracker.add_global(name, value)

    def evaluate(self, step: int, *, last: bool = False) -> dict[str, float]:
        """``eval/<set>/...`` metrics when ``--eval-interval`` divides ``step`` or ``step``
        is the ``last`` of a run cut short, else ``{}``."""
        return maybe_evaluate(self.cfg, step, self.model, self.tokenizer, self.ctx.device,
                              group=self.ctx.group, eval_sets=self.eval_sets, last=last)

    def out_of_time(self) -> bool:
        """Whether ``--exit-duration-in-mins`` has passed; the ranks agree (MAX), so every
        rank ends after the same step."""
        limit = self.cfg.exit_duration_in_mins
        if limit is None:
            return False
        late = torch.tensor([float(time.monotonic() - self.started >= 60.0 * limit)],
                            device=self.ctx.device)
        if self.ctx.group is not None:
            late = all_reduce(late, self.ctx.group, dist.ReduceOp.MAX)
        return bool(late.item())

    def log(self, step: int, b: StepBatch, times: dict[str, float],
            extra: dict[str, float] | None = None) -> dict[str, float]:
        mask = b.generated.response_mask
        B = mask.shape[0]
        self.tracker.add_ratio("rollout/response_length", mask.sum(), B)
        self.tracker.add_ratio("rollout/truncated", b.generated.truncated.sum(), B)
        self.tracker.add_sum("perf/generated_tokens", mask.sum())
        # the slowest rank sets the pace of a synchronous step
        for name, seconds in times.items():
            self.tracker.add_max(f"perf/{name}_time", seconds)
        self.tracker.add_max("perf/peak_memory_gb", peak_memory_gb(self.ctx.device))
        for name, r in (("perf/forward_flops", b.rollout), ("perf/generate_flops", b.generated)):
            # an episode's training forward also runs over the environment's tokens
            responses = (r.response_mask if r.context_mask is None else r.context_mask).sum(-1)
            self.tracker.add_sum(name, self.shape.forward_flops(
                r.prompt_mask.sum(-1) + responses, responses))
        metrics = self.tracker.reduce()
        passes = int(setup.needs_old_log_probs(self.cfg)) + int(self.has_reference)
        metrics.update(phase_metrics(
            metrics.pop("perf/forward_flops"), log_prob_passes=passes,
            generate_forward=metrics.pop("perf/generate_flops"),
            skipped_fraction=metrics.get("perf/backward_skipped_fraction", 0.0),
            times={k: metrics.get(f"perf/{k}_time", 0.0)
                   for k in ("step", "update", "log_prob", "generate")},
            peak_flops=self.peak_flops * self.ctx.world_size, decode_steps=b.decode_steps,
            weight_bytes=self.shape.weight_bytes, bandwidth=self.bandwidth))
        # the limits the ratios divide by, so a reader of metrics.jsonl can check them
        metrics["perf/peak_tflops"] = self.peak_flops / 1e12
        metrics["perf/bandwidth_gb_per_s"] = self.bandwidth / 1e9
        metrics["perf/generated_tokens_per_s"] = metrics.pop("perf/generated_tokens") / max(
            metrics["perf/rollout_time"], 1e-9)
        metrics.update(extra or {})
        self.logger.log(step, metrics)
        return metrics

    def log_samples(self, step: int, b: StepBatch) -> None:
        """``--log-samples`` of the samples this step trains on, spread over rank 0's groups,
        to samples.jsonl (and TensorBoard text / a W&B table when those are on)."""
        if not self.ctx.is_main or not self.cfg.log_samples:
            return
        lengths = b.rollout.response_mask.sum(dim=1).tolist()
        rows = [{"prompt": b.prompts[i], "response": b.responses[i],
                 "reward": float(b.rewards[i]), "label": b.labels[i],
                 "response_length": int(lengths[i]), "truncated": bool(b.rollout.truncated[i])}
                for i in spread_indices(self.cfg.log_samples, len(b.prompts))]
        self.logger.log_samples(step, rows)

    def save(self, step: int, *, final: bool, blocking: bool = False) -> str:
        """The checkpoint of ``step`` (with ``--async-save`` only started unless ``blocking``),
        or with ``final`` also the Hugging Face model in ``--save`` itself."""
        progress = {
            "rollout_step": step,
            "data": {**self.source.position_at(self.cursor), "cursor": self.cursor},
            # metrics.jsonl holds the rows of steps 1..step when this checkpoint is taken;
            # rows a crashed run wrote after it are superseded by the resumed run's rows
            "metrics": {"last_step": step, "file": "metrics.jsonl"},
            "world_size": self.ctx.world_size,
            "seed": self.cfg.seed,
        }
        meta = {"progress": progress, "advantage_estimator": self.cfg.advantage_estimator,
                "config": json.loads(json.dumps(self.cfg.to_dict(), default=str))}
        state = dict(model=self.model, optimizer=self.optimizer, tokenizer=self.tokenizer,
                     meta=meta)
        if final:
            return self.checkpointer.save_final(step, **state)
        return self.checkpointer.save(step, blocking=blocking, **state)

    def stop_requested(self) -> bool:
        """Whether any rank got SIGTERM/SIGINT; ranks agree, so all stop at the same step."""
        flag = self.stop.signum is not None
        if self.ctx.group is None:
            return flag
        flag_t = torch.tensor([float(self.stop.signum or 0)], device=self.ctx.device)
        signum = int(all_reduce(flag_t, self.ctx.group, dist.ReduceOp.MAX).item())
        if signum and self.stop.signum is None:
            self.stop.signum = signum
        return bool(signum)

    def stop_now(self, step: int) -> None:
        """Checkpoint (with ``--save``) after the completed ``step`` and raise Interrupted."""
        signum = self.stop.signum
        where = ""
        if self.cfg.save and step > self.start_step:
            path = self.save(step, final=False, blocking=True)
            where = f"; checkpoint {path}; continue with --load {self.cfg.save}"
        elif self.cfg.save:
            where = "; no new step to save"
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after rollout step "
                          f"{step} of {self.total_steps}{where}")

    # ------------------------------------------------------------------ the loop
    def fit(self) -> list[dict[str, float]]:
        history = []
        for step in range(self.start_step, self.total_steps):
            if self.stop_requested():
                self.stop_now(step)
            t = self.timer
            with t("step"):
                with t("rollout"):  # generate and reward: rounds with dynamic sampling, turns
                    # with --env (an episode interleaves generation and the environment)
                    if self.episodes is not None:
                        with t("generate"):
                            b = self.play_episodes(step)
                    else:
                        b = self.collect(step)
                with t("train"):
                    if len(b.prompts):  # dynamic sampling may keep no group: then no update
                        with t("log_prob"):
                            exp = self.old_and_ref_log_probs(b.rollout)
                        with t("advantage"):
                            exp = self.advantages(exp, b.rewards, b.group_index)
                        with t("update"):
                            self.update(exp)
            # a run out of time ends here as if this were its last step: measured and saved
            last = step + 1 < self.total_steps and self.out_of_time()
            with t("eval"):
                evaluation = self.evaluate(step + 1, last=last)
            history.append(self.log(step + 1, b, t.pop(), evaluation))
            self.log_samples(step + 1, b)
            if self.checkpointer is not None:
                self.checkpointer.poll()  # publish an --async-save that has finished
            if last:
                self.ended_early = (f"stopped by --exit-duration-in-mins "
                                    f"{self.cfg.exit_duration_in_mins:g} after rollout step "
                                    f"{step + 1} of {self.total_steps}")
                break
            if self.cfg.save and self.cfg.save_interval and (step + 1) % self.cfg.save_interval == 0:
                self.save(step + 1, final=False)
        if self.cfg.save:
            self.save(self.start_step + len(history), final=True)
        return history

    def close(self) -> None:
        self.logger.close()
        if self.episodes is not None:
            self.episodes.close()


def run(cfg, *, console: bool = True) -> list[dict[str, float]]:
    """Train as configured; return the metrics of each rollout step (raises RelaxError)."""
    start = time.perf_counter()
    stop = StopRequest()
    stop.install()
    try:
        ctx = init_distributed(cfg.device, cfg.distributed_timeout_minutes)
        trainer = Trainer(cfg, ctx, console=console, stop=stop)
        try:
            history = trainer.fit()
            ended_early = trainer.ended_early
            finish_together(ctx)
        finally:
            trainer.close()
    except RelaxError:
        raise
    except Exception as e:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and is_peer_failure(e):
            raise PeerFailure(
                "a collective failed: another data-parallel rank died or did not answer "
                f"within --distributed-timeout-minutes {cfg.distributed_timeout_minutes:g} "
                "(see its own message): "
                f"{type(e).__name__}: {' '.join(str(e).split())[:300]}") from e
        raise
    finally:
        stop.restore()
    if ctx.is_main and console:
        where = f"; model saved to {cfg.save}" if cfg.save else ""
        if ended_early:
            where += f" ({ended_early}; continue with --load {cfg.save})" if cfg.save else \
                f" ({ended_early})"
        print(f"relax train: {len(history)} rollout steps in {time.perf_counter() - start:.1f} s; "
              f"metrics in {os.path.join(cfg.output_dir, 'metrics.jsonl')}{where}",
              file=sys.stderr)
    return history


def train(cfg) -> int:
    """``relax train``: exit status 0, or print one ``relax train: error:`` line and return
    the error's status (2 bad input, 1 failure during training).

    A rank of a multi-process run does not return: it ends its process with that status
    through :func:`exit_rank` once the group is left, so the interpreter's finalization never
    meets Gloo's worker threads (see there)."""
    peer_failed = False
    try:
        run(cfg)
        status = 0
    except RelaxError as e:
        peer_failed = isinstance(e, PeerFailure)
        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""
        print(f"relax train: error: {prefix}{e}", file=sys.stderr, flush=True)
        status = e.exit_code
    finally:
        shutdown_distributed(peer_failed=peer_failed)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # after a peer failure the broken group is left as it is; metrics and checkpoints are
        # already on disk
        exit_rank(status, run_exit_handlers=not peer_failed)
    return status
