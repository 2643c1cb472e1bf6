"""A training run's parts, built from its configuration: ``build(cfg, ctx) -> Parts``, which the
:class:`~relax.trainer.loop.Trainer` only runs.

    checks       model paths, the checkpoint to resume, the data, the reward plug-ins, the
                 environments (--env), the evaluation sets: bad input stops the run here,
                 before any model is loaded (exit 2)
    backend      --rollout-backend vllm: the server (closed again on any failure below; with
                 --fully-async the rollout ranks' instead, relax/trainer/fully_async/rollout_worker.py)
    models       the policy (its prompt-length checks), the --use-opd teacher, the
                 --opd-type self teacher, the ppo critic
    rollout      the collector (relax/rollout/assembly.py; --fully-async: the batches of the
                 rollout ranks, relax/trainer/fully_async/remote_rollout.py) and the weights' publisher
                 (relax/trainer/fully_async/publish.py)
    run          checkpointer, run control, the resumed state, the metric sinks; then the
                 publisher starts (the rollout ranks wait for it before anything else)
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch

from relax import models
from relax.agreement import GroupAgreement
from relax.cpu_threads import cpu_threads
from relax.errors import InputError
from relax.eval.sets import load_eval_sets
from relax.metrics.sinks import build_logger
from relax.metrics.tracker import MetricTracker
from relax.plugins import load_function
from relax.precision import use_bf16
from relax.rollout.assembly import build_rollout_side
from relax.rollout.backends.local import LocalBackend
from relax.rollout.backends.open import open_backend
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.prompts.data import check_formatted_lengths, report_overlap
from relax.rollout.prompts.privileged import teacher_samples
from relax.rollout.reward.judge import check_judging_lengths
from relax.rundirs import check_free_space
from relax.trainer import checkpoint, parts
from relax.trainer.critic import Critic
from relax.trainer.distill import Distillation
from relax.trainer.distributed import reshard
from relax.trainer.fully_async.async_layout import Schedule
from relax.trainer.fully_async.publish import publisher_for
from relax.trainer.fully_async.remote_rollout import RemoteRollout
from relax.trainer.off_policy import MismatchMeter, OffPolicy
from relax.trainer.policy import Policy
from relax.trainer.resume import check_resume, find_resume, load_trainer_state, report_resume
from relax.trainer.run_control import RunControl
from relax.trainer.runtime import Timer
from relax.trainer.self_distill import SelfDistillation
from relax.trainer.signals import StopRequest
from relax.trainer.step_metrics import StepMetrics
from relax.trainer.update import LossSettings

ADVANTAGE_FLAG = "--custom-advantage-function-path"


@dataclass
class Parts:
    """What the loop runs (relax/trainer/loop.py); ``None`` where the configuration has none."""

    timer: Timer
    tracker: MetricTracker
    mismatch: MismatchMeter  # the sampler against the trainer (§7a)
    bf16: bool
    samples: list | None
    source: object
    scorer: object
    group_filter: object | None
    custom_advantage: object | None
    total_steps: int
    loss_settings: LossSettings
    eval_sets: list
    backend: RolloutBackend
    policy: Policy | None = None
    step_metrics: StepMetrics | None = None
    distill: Distillation | None = None
    opsd: SelfDistillation | None = None
    critic: Critic | None = None
    collector: object = None
    publisher: object = None
    checkpointer: object = None
    control: RunControl | None = None
    logger: object = None
    start_step: int = 0

    def close_backend(self) -> None:
        """What the rollout backend started (an owned vLLM server) and a teacher's server end
        with the run."""
        try:
            if self.distill is not None:
                self.distill.close()
        finally:
            self.backend.close()


def build(cfg, ctx, *, console: bool = True, stop: StopRequest | None = None,
          layout=None) -> Parts:
    """Every part of a run, in the module docstring's order (``layout``: --fully-async)."""
    started = time.monotonic()  # --exit-duration-in-mins counts from here
    stop = stop or StopRequest()
    p, side, resume = _checked(cfg, ctx, stop, layout)
    try:
        _models(p, cfg, ctx)
        p.step_metrics.remote_generation = layout is not None or p.backend.remote
        p.collector = _collector(p, cfg, ctx, layout, side)
        p.publisher = publisher_for(p.collector, p.backend, layout=layout, policy=p.policy,
                                    timer=p.timer, tracker=p.tracker)
        _run(p, cfg, ctx, stop, started, resume, console, layout)
        p.publisher.start(p.start_step, resumed=resume is not None)
    except BaseException:
        p.close_backend()
        raise
    return p


def _checked(cfg, ctx, stop, layout):
    """Everything that can fail on bad input, before any model is loaded; the vLLM server."""
    bf16 = use_bf16(cfg.system.bf16, ctx.device)
    models.check_model_paths(cfg)
    resume = find_resume(cfg, report=ctx.is_main)
    # this rank's share of the rollout side (--fully-async: the rollout ranks build the
    # environments and score with the judge)
    side = build_rollout_side(cfg, [(ctx, GroupAgreement(ctx.group, ctx.device))],
                              device=ctx.device, bf16=bf16, stop=stop,
                              samples_here=layout is None)
    inputs = side.inputs
    if cfg.world_size != ctx.world_size:  # validation's batch rules assumed its own
        raise InputError(f"the configuration was resolved for WORLD_SIZE={cfg.world_size} but "
                         f"this run has {ctx.world_size} data-parallel ranks; parse the "
                         "flags under this launch (parse_train_config reads WORLD_SIZE)")
    b = cfg.batches
    total_steps = b.num_rollout or b.num_epoch * inputs.source.steps_per_epoch
    if resume:
        changed = check_resume(cfg, resume[0], resume[1], total_steps)
        if changed and ctx.is_main:
            print(changed, file=sys.stderr)
    # (--env evaluates on held-out environment seeds instead: relax/eval/env_eval.py)
    eval_sets = load_eval_sets(cfg) if cfg.evaluation.interval and not cfg.rollout.episodes.env else []
    if inputs.samples is not None and ctx.is_main:
        report_overlap(inputs.samples, eval_sets, report=lambda line: print(line, file=sys.stderr))
    loss = LossSettings(cfg.algorithm, OffPolicy.load(cfg.rollout.off_policy),
                        temperature=cfg.rollout.sampling.temperature, bf16=bf16,
                        max_tokens=b.max_tokens_per_gpu if b.token_budget else None,
                        layout=b.pass_layout, opsd=cfg.distillation.self_mode)
    p = Parts(timer=Timer(ctx.device), tracker=MetricTracker(ctx.group, ctx.device),
              mismatch=MismatchMeter(), bf16=bf16, samples=inputs.samples, source=inputs.source,
              scorer=side.shares[0].scorer, group_filter=inputs.group_filter, total_steps=total_steps,
              custom_advantage=(load_function(cfg.algorithm.custom_advantage_path, ADVANTAGE_FLAG)
                                if cfg.algorithm.custom_advantage_path else None),
              loss_settings=loss, eval_sets=eval_sets,
              backend=_backend(cfg, ctx, layout))
    return p, side, resume


def _backend(cfg, ctx, layout) -> RolloutBackend:
    """--rollout-backend vllm: an unreachable --vllm-url or a missing vLLM stops the run
    here, before any model loads; an owned server is closed on any failure after. Under
    --fully-async the rollout ranks sample (rollout_worker.py): a training rank's backend is
    its own engine, never asked for a sampler."""
    if layout is not None:
        return LocalBackend(ctx.device)
    return open_backend(cfg, ctx.rank, ctx.device, shards=ctx if cfg.system.fsdp else None,
                        release=reshard)


def _models(p: Parts, cfg, ctx) -> None:
    p.policy = _policy(p, cfg, ctx)
    tokenizer, module = p.policy.tokenizer, p.policy.module
    # --use-opd: the teacher, its vocabulary checked against the student's before any step
    p.distill = Distillation.build(cfg.distillation, ctx, tokenizer=tokenizer, student=module,
                                   bf16=p.bf16, run_dir=cfg.run.output_dir, seed=cfg.run.seed)
    # --opd-type self: the frozen initial model reading the privileged prompts (§7b)
    p.opsd = SelfDistillation.build(cfg, ctx, tokenizer=tokenizer, student=module, bf16=p.bf16)
    # ppo: the value model, --critic-load checked against it before any step (§5c)
    p.critic = Critic.build(cfg, ctx, tokenizer=tokenizer, bf16=p.bf16)
    p.backend.start(module, bf16=p.bf16, lora=p.policy.lora)


def _policy(p: Parts, cfg, ctx) -> Policy:
    models.quiet_transformers()  # no download/shard progress bars between summary lines
    tokenizer = models.load_tokenizer(cfg.model.hf_checkpoint)
    if cfg.rollout.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise InputError(f"--apply-chat-template: the tokenizer in {cfg.model.hf_checkpoint} has "
                         "no chat template; remove the flag or use a chat model")
    # a resumed run starts from the same model; the checkpoint's state replaces its weights
    module = models.load_policy(cfg.model.hf_checkpoint, tokenizer, ctx.device, seed=cfg.run.seed)
    _check_prompt_lengths(p, cfg, tokenizer, module)
    # the FLOP counts are the model's own (a LoRA adapter's are not model FLOPs)
    passes = int(parts.needs_old_log_probs(cfg)) + int(parts.needs_reference(cfg.algorithm))
    p.step_metrics = StepMetrics.measure(module, p.tracker, ctx, peak_tflops=cfg.system.peak_tflops,
                                         bf16=p.bf16, log_prob_passes=passes,
                                         layout=cfg.batches.pass_layout)
    p.step_metrics.padding_note = not cfg.batches.token_budget
    policy = Policy.build(module, cfg, ctx, tokenizer,
                          eos_token_ids=models.eos_token_ids(tokenizer, module), bf16=p.bf16)
    if ctx.is_main:
        check_free_space(cfg.checkpoint.save, policy.trainable_count())
    return policy


def _check_prompt_lengths(p: Parts, cfg, tokenizer, module) -> None:
    """Training and evaluation prompts must fit the model context with a full response
    (else the prompt's file:line, or its evaluation set and number)."""
    context = getattr(module.config, "max_position_embeddings", None)
    fmt = dict(apply_chat_template=cfg.rollout.data.apply_chat_template,
               system_prompt=cfg.rollout.data.system_prompt)
    longest = cfg.rollout.sampling.max_response_len
    if p.samples is not None:
        check_formatted_lengths(tokenizer, p.samples, **fmt, context=context, max_response=longest)
        if cfg.distillation.self_mode:  # the teacher reads the longer privileged prompts
            check_formatted_lengths(tokenizer, teacher_samples(p.samples), **fmt,
                                    context=context, max_response=longest)
    check_judging_lengths(p.scorer.judge, tokenizer, p.samples, **fmt, max_response=longest)
    for eval_set in p.eval_sets:
        check_formatted_lengths(tokenizer, eval_set.as_samples(), **fmt, context=context,
                                max_response=cfg.evaluation.max_response_len,
                                length_flag="--eval-max-response-len")


def _collector(p: Parts, cfg, ctx, layout, side):
    """This rank's collector: the rollout side's assembly on the training rank's own share,
    sampling through the rank's backend, or (--fully-async) the batches the rollout ranks
    sample."""
    pol = p.policy
    if layout is not None:
        # with --save the final checkpoint holds the batches in flight after the last step
        schedule = Schedule(cfg.placement.max_staleness, cfg.placement.update_weights_interval,
                            p.total_steps, carry=cfg.checkpoint.save is not None)
        return RemoteRollout(cfg.batches, ctx, layout, schedule, policy=pol, source=p.source,
                             tracker=p.tracker,
                             timeout_minutes=cfg.run.distributed_timeout_minutes,
                             bucket_bytes=int(cfg.placement.weight_sync_bucket_mb * 2**20),
                             fsdp=cfg.system.fsdp)
    [collector] = side.collectors(cfg, p.backend, tokenizer=pol.tokenizer,
                                  eos_token_ids=pol.eos_token_ids, context=pol.context,
                                  timers=[p.timer], trackers=[p.tracker])
    return collector


def _run(p: Parts, cfg, ctx, stop, started: float, resume, console: bool, layout) -> None:
    if ctx.device.type == "cpu":
        # the host's cores shared between the local ranks (relax/cpu_threads.py)
        torch.set_num_threads(cpu_threads(
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    if ctx.is_main:
        checkpoint.remove_stale_temps(cfg.checkpoint.save)
    p.checkpointer = checkpoint.Checkpointer.of(
        cfg.checkpoint, ctx, p.policy, fsdp=cfg.system.fsdp, rank_state=p.collector.state_dict,
        extra_state=p.critic and p.critic.checkpoint_state,
        async_group=layout and layout.save_group)  # --fully-async --async-save
    p.control = RunControl(ctx, stop, total_steps=p.total_steps,
                           exit_duration_in_mins=cfg.run.exit_duration_in_mins, started=started)
    if resume:
        _resume(p, cfg, ctx, *resume)
    p.logger = build_logger(
        is_main=ctx.is_main, output_dir=cfg.run.output_dir, total_steps=p.total_steps,
        start_step=p.start_step, console=console, tensorboard=cfg.run.use_tensorboard,
        wandb=cfg.run.use_wandb, config=cfg.to_dict(), samples=cfg.run.log_samples > 0,
    )


def _resume(p: Parts, cfg, ctx, path: str, step: int) -> None:
    """The policy's state and this rank's RNG from ``path``; the collector continues where
    the checkpoint left it."""
    progress = load_trainer_state(path, p.policy, fsdp=cfg.system.fsdp, ctx=ctx)
    p.start_step = step
    if p.critic is not None:
        p.critic.load(path)
    saved = progress.get("data")
    p.collector.load_state_dict(progress.get("collector") or {
        "cursor": (saved or {}).get("cursor", step * cfg.batches.rollout_batch_size)})
    if ctx.is_main:
        report_resume(cfg, path, step, saved, p.collector.position(),
                      fixed_stride=p.group_filter is None and not cfg.rollout.partial.enabled,
                      source=p.source)
