"""A training run's parts, built from its configuration: ``build(cfg, ctx) -> Parts``, a
frozen record the :class:`~relax.trainer.loop.Trainer` holds and only runs. The composition
root of a training rank: the one place that reads the whole configuration and hands each part
its sections.

    checks       model paths, the checkpoint to resume, the data, the reward plug-ins, the
                 environments (--env), the evaluation sets: bad input stops the run here,
                 before any model is loaded (exit 2)
    backend      --rollout-backend vllm: the server (closed again on any failure below; with
                 --fully-async the rollout ranks' instead, relax/trainer/fully_async/rollout_worker.py)
    models       the policy (its prompt-length checks) and the training terms
                 (relax/trainer/terms/): the --use-opd teacher, the --opd-type self teacher,
                 the ppo critic, the reference pass, the custom advantage plug-in, the
                 mismatch meter
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
from dataclasses import dataclass, field
from functools import partial

import torch

from relax import estimators, models
from relax.agreement import GroupAgreement
from relax.cpu_threads import cpu_threads
from relax.errors import InputError
from relax.eval.sets import load_eval_sets
from relax.metrics.sinks import MetricsLogger, build_logger
from relax.metrics.tracker import MetricTracker
from relax.precision import use_bf16, use_rollout_bf16
from relax.rollout.assembly import build_rollout_side
from relax.rollout.backends.local import LocalBackend
from relax.rollout.backends.open import open_backend
from relax.rollout.backends.protocol import RolloutBackend
from relax.rollout.collectors import Collector
from relax.rollout.prompts.data import check_formatted_lengths, report_overlap
from relax.rollout.prompts.privileged import teacher_samples
from relax.rollout.reward.judge import check_judging_lengths
from relax.rollout.reward.scoring import Scorer
from relax.rundirs import check_free_space
from relax.trainer.distributed import reshard
from relax.trainer.fully_async.async_layout import Schedule
from relax.trainer.fully_async.publish import Publisher, publisher_for
from relax.trainer.fully_async.remote_rollout import RemoteRollout
from relax.trainer.perf.step_metrics import StepMetrics
from relax.trainer.policy import passes
from relax.trainer.policy.bundle import Policy
from relax.trainer.policy.update import LossSettings
from relax.trainer.run_control import RunControl
from relax.trainer.runtime import Timer
from relax.trainer.signals import StopRequest
from relax.trainer.state import checkpoint
from relax.trainer.state.resume import check_resume, find_resume, load_trainer_state, report_resume
from relax.trainer.terms.critic import Critic
from relax.trainer.terms.custom_advantage import CustomAdvantage
from relax.trainer.terms.distillation import Distillation
from relax.trainer.terms.kl import Reference
from relax.trainer.terms.length_control import LengthControl
from relax.trainer.terms.off_policy import MismatchMeter, OffPolicy
from relax.trainer.terms.rollout_correction import RolloutCorrection
from relax.trainer.terms.router import RouterTerm
from relax.trainer.terms.routing_replay import RoutingReplay
from relax.trainer.terms.self_distillation import SelfDistillation
from relax.trainer.terms.term import Term


@dataclass(frozen=True)
class Parts:
    """What the loop runs (relax/trainer/loop.py), built once by :func:`build`.

    ``terms``: the configured training terms in the order the loop calls them
    (relax/trainer/terms/term.py): the reference pass, the ppo critic, the custom advantage
    plug-in, the distillation teacher, self-distillation, the mismatch meter, the rollout
    correction (§7c), the length control (§7d); the loss adds the
    algorithm's own (entropy, KL loss, TIS, OPSM: ``update.loss_terms``). ``old_log_probs``:
    whether the rollout step runs the pi_old pass (relax/trainer/policy/passes.py)."""

    timer: Timer
    tracker: MetricTracker
    policy: Policy
    terms: tuple[Term, ...]
    loss_settings: LossSettings
    old_log_probs: bool
    step_metrics: StepMetrics
    scorer: Scorer
    eval_sets: list
    collector: Collector
    publisher: Publisher
    checkpointer: checkpoint.Checkpointer
    control: RunControl
    logger: MetricsLogger
    total_steps: int
    start_step: int
    backend: RolloutBackend

    def close_backend(self) -> None:
        """A teacher's server and an owned vLLM server end with the run."""
        _close(self.terms, self.backend)


@dataclass
class _Draft:
    """The parts while :func:`build` makes them (``None`` until then)."""

    timer: Timer
    tracker: MetricTracker
    bf16: bool
    samples: list | None
    source: object
    scorer: object
    group_filter: object | None
    custom_advantage: CustomAdvantage | None
    total_steps: int
    loss_settings: LossSettings
    eval_sets: list
    backend: RolloutBackend
    policy: Policy | None = None
    step_metrics: StepMetrics | None = None
    terms: list = field(default_factory=list)  # each added as soon as it is built
    collector: object = None
    publisher: object = None
    checkpointer: object = None
    control: RunControl | None = None
    logger: object = None
    start_step: int = 0

    def close_backend(self) -> None:
        _close(self.terms, self.backend)

    def parts(self, *, old_log_probs: bool) -> Parts:
        return Parts(timer=self.timer, tracker=self.tracker, policy=self.policy,
                     terms=tuple(self.terms), loss_settings=self.loss_settings,
                     old_log_probs=old_log_probs,
                     step_metrics=self.step_metrics, scorer=self.scorer,
                     eval_sets=self.eval_sets, collector=self.collector,
                     publisher=self.publisher, checkpointer=self.checkpointer,
                     control=self.control, logger=self.logger, total_steps=self.total_steps,
                     start_step=self.start_step, backend=self.backend)


def _close(terms, backend: RolloutBackend) -> None:
    """The terms' servers (a distillation teacher's) and what the rollout backend started
    (an owned vLLM server) end with the run."""
    try:
        for term in terms:
            term.close()
    finally:
        backend.close()


def build(cfg, ctx, *, console: bool = True, stop: StopRequest | None = None,
          layout=None) -> Parts:
    """Every part of a run, in the module docstring's order (``layout``: --fully-async).
    The one reader of the whole configuration here: each step gets the sections it reads."""
    started = time.monotonic()  # --exit-duration-in-mins counts from here
    stop = stop or StopRequest()
    # everything that can fail on bad input, before any model is loaded; the vLLM server
    bf16 = use_bf16(cfg.system.bf16, ctx.device)
    models.check_model_paths(cfg.model)
    resume = find_resume(cfg.checkpoint, report=ctx.is_main)
    # this rank's share of the rollout side (--fully-async: the rollout ranks build the
    # environments and score with the judge)
    side = build_rollout_side(cfg, [(ctx, GroupAgreement(ctx.group, ctx.device))],
                              device=ctx.device, bf16=bf16, stop=stop,
                              samples_here=layout is None)
    total_steps = _total_steps(ctx, side.inputs, batches=cfg.batches,
                               world_size=cfg.world_size)
    if resume:
        changed = check_resume(cfg, resume[0], resume[1], total_steps)
        if changed and ctx.is_main:
            print(changed, file=sys.stderr)
    p = _checked(ctx, side, layout, bf16=bf16, total_steps=total_steps,
                 evaluation=cfg.evaluation, rollout=cfg.rollout, algorithm=cfg.algorithm,
                 batches=cfg.batches, distillation=cfg.distillation, system=cfg.system,
                 model=cfg.model, run=cfg.run, placement=cfg.placement)
    try:
        _models(p, ctx, model=cfg.model, run=cfg.run, rollout=cfg.rollout,
                algorithm=cfg.algorithm, batches=cfg.batches, distillation=cfg.distillation,
                critic=cfg.critic, lora=cfg.lora, recompute=cfg.recompute, system=cfg.system,
                optimizer=cfg.optimizer, evaluation=cfg.evaluation, save_dir=cfg.checkpoint.save)
        p.step_metrics.remote_generation = layout is not None or p.backend.remote
        p.collector = _collector(p, ctx, layout, side, placement=cfg.placement,
                                 save_dir=cfg.checkpoint.save, batches=cfg.batches, run=cfg.run,
                                 system=cfg.system, rollout=cfg.rollout)
        p.publisher = publisher_for(p.collector, p.backend, layout=layout, policy=p.policy,
                                    timer=p.timer, tracker=p.tracker)
        _run(p, ctx, stop, started, resume, console, layout, checkpointing=cfg.checkpoint,
             system=cfg.system, run=cfg.run, batches=cfg.batches, rollout=cfg.rollout,
             run_config=cfg.to_dict())
        p.publisher.start(p.start_step, resumed=resume is not None)
    except BaseException:
        p.close_backend()
        raise
    return p.parts(old_log_probs=passes.needs_old_log_probs(cfg.algorithm, cfg.batches,
                                                            cfg.distillation))


def _total_steps(ctx, inputs, *, batches, world_size: int) -> int:
    """The run's rollout steps (--num-rollout, else --num-epoch epochs of ``inputs``),
    once the configuration is known to have been resolved for this launch's ranks."""
    if world_size != ctx.world_size:  # validation's batch rules assumed its own
        raise InputError(f"the configuration was resolved for WORLD_SIZE={world_size} but "
                         f"this run has {ctx.world_size} data-parallel ranks; parse the "
                         "flags under this launch (parse_train_config reads WORLD_SIZE)")
    return batches.num_rollout or batches.num_epoch * inputs.source.steps_per_epoch


def terms_state(terms) -> dict:
    """The terms' entries of a checkpoint (the critic's), beside the policy's."""
    return {k: v for term in terms for k, v in term.checkpoint_state().items()}


def _checked(ctx, side, layout, *, bf16: bool, total_steps: int, evaluation, rollout,
             algorithm, batches, distillation, system, model, run, placement) -> _Draft:
    """The rest of what can fail on bad input (the evaluation sets, the plug-ins), before any
    model is loaded; the vLLM server last."""
    inputs = side.inputs
    # (--env evaluates on held-out environment seeds instead: relax/eval/env_eval.py)
    eval_sets = (load_eval_sets(evaluation, rollout)
                 if evaluation.eval_interval and not rollout.episodes.env else [])
    if inputs.samples is not None and ctx.is_main:
        report_overlap(inputs.samples, eval_sets, report=lambda line: print(line, file=sys.stderr))
    loss = LossSettings(algorithm, OffPolicy.load(rollout.off_policy),
                        temperature=rollout.sampling.rollout_temperature, bf16=bf16,
                        max_tokens=(batches.max_tokens_per_gpu if batches.use_dynamic_batch_size
                                    else None),
                        layout=batches.pass_layout, opsd=distillation.self_mode)
    return _Draft(timer=Timer(ctx.device), tracker=MetricTracker(ctx.group, ctx.device),
                  bf16=bf16, samples=inputs.samples, source=inputs.source,
                  scorer=side.shares[0].scorer, group_filter=inputs.group_filter,
                  total_steps=total_steps,
                  custom_advantage=CustomAdvantage.load(algorithm.custom_advantage_function_path),
                  loss_settings=loss, eval_sets=eval_sets,
                  backend=_backend(ctx, layout, rollout=rollout, placement=placement,
                                   model=model, run=run, fsdp=system.fsdp))


def _backend(ctx, layout, *, rollout, placement, model, run, fsdp: bool) -> RolloutBackend:
    """--rollout-backend vllm: an unreachable --vllm-url or a missing vLLM stops the run
    here, before any model loads; an owned server is closed on any failure after. Under
    --fully-async the rollout ranks sample (rollout_worker.py): a training rank's backend is
    its own engine, never asked for a sampler."""
    if layout is not None:
        return LocalBackend(ctx.device)
    return open_backend(rollout, ctx.rank, ctx.device, placement=placement, model=model,
                        run=run, shards=ctx if fsdp else None, ranks=ctx, release=reshard)


def _models(p: _Draft, ctx, *, model, run, rollout, algorithm, batches, distillation, critic,
            lora, recompute, system, optimizer, evaluation, save_dir: str | None) -> None:
    p.policy = _policy(p, ctx, model=model, run=run, rollout=rollout, algorithm=algorithm,
                       batches=batches, distillation=distillation, lora=lora,
                       recompute=recompute, system=system, optimizer=optimizer,
                       evaluation=evaluation, save_dir=save_dir)
    tokenizer, module = p.policy.tokenizer, p.policy.module
    # --use-opd: the teacher, its vocabulary checked against the student's before any step
    _add(p, Distillation.build(distillation, ctx, tokenizer=tokenizer, student=module,
                               bf16=p.bf16, run_dir=run.output_dir, seed=run.seed))
    # --opd-type self: the frozen initial model reading the privileged prompts (§7b)
    _add(p, SelfDistillation.build(distillation, ctx, tokenizer=tokenizer, student=module,
                                   bf16=p.bf16, initial=model.hf_checkpoint, seed=run.seed,
                                   temperature=rollout.sampling.rollout_temperature))
    # ppo: the value model, --critic-load checked against it before any step (§5c)
    value = (_critic(p, ctx, model=model, run=run, critic=critic, lora=lora, recompute=recompute,
                     fsdp=system.fsdp, optimizer=optimizer)
             if estimators.facts(algorithm.advantage_estimator).needs_critic else None)
    # the loop's order: the reference pass, the critic (its values and targets first), the
    # custom advantages, then the distillation terms on them (§7b), the mismatch meter
    p.terms[:0] = [t for t in (_reference(p.policy, algorithm), value, p.custom_advantage)
                   if t is not None]
    _add(p, MismatchMeter() if rollout.off_policy.get_mismatch_metrics else None)
    # --rollout-is / --rollout-rs / --rollout-token-veto-threshold (§7c): a loss factor with
    # the step's weight sums as state
    _add(p, RolloutCorrection.build(rollout.off_policy))
    # --overlong-buffer-len / --length-penalty-coef / --overlong-filter (§7d): last, so the
    # filter's advantage 0 follows every term's
    _add(p, LengthControl.build(rollout.length, rollout.sampling.rollout_max_response_len))
    # a mixture-of-experts policy (docs/moe.md): routing replay and its mismatch metrics, then
    # the router's metrics and --moe-aux-loss-coef (their hooks see the replayed experts)
    _add(p, _routing_replay(p, module, rollout.off_policy, ctx))
    _add(p, RouterTerm.build(module, algorithm.moe_aux_loss_coef, ctx.group))
    # the sampler at its own precision (--rollout-bf16), the trainer's passes at --bf16
    p.backend.start(module, bf16=use_rollout_bf16(rollout.backend.rollout_bf16, p.bf16),
                    lora=p.policy.lora)


def _routing_replay(p: _Draft, module, off_policy, ctx) -> RoutingReplay | None:
    """The policy's routing replay; R3 needs a sampler that records the routing (Relax's
    engine; the vLLM backend's routed experts are not read yet)."""
    if off_policy.use_rollout_routing_replay and p.backend.remote:
        raise InputError("--use-rollout-routing-replay: the vLLM backend's routing is not "
                         "recorded by Relax yet (docs/moe.md); sample with Relax's engine or "
                         "use --use-routing-replay")
    return RoutingReplay.build(module, off_policy, ctx.group)


def _critic(p: _Draft, ctx, *, model, run, critic, lora, recompute, fsdp: bool,
            optimizer) -> Critic:
    """ppo's critic on the policy's architecture at its initial weights (or --critic-load)."""
    lm = models.load_policy(model.hf_checkpoint, p.policy.tokenizer, ctx.device, seed=run.seed)
    return Critic.build(critic, ctx, lm, bf16=p.bf16, lora=lora, recompute=recompute,
                        fsdp=fsdp, optimizer=optimizer, seed=run.seed)


def _add(p: _Draft, term: Term | None) -> None:
    """A built term joins the run's (and is closed with it from now on)."""
    if term is not None:
        p.terms.append(term)


def _reference(policy: Policy, algorithm) -> Reference | None:
    """The reference pass when a KL term reads it (§3 shaping, §7 KL loss)."""
    return Reference(policy) if passes.needs_reference(algorithm) else None


def _policy(p: _Draft, ctx, *, model, run, rollout, algorithm, batches, distillation, lora,
            recompute, system, optimizer, evaluation, save_dir: str | None) -> Policy:
    """The policy from --hf-checkpoint (``model``), its prompts checked against its context,
    its FLOP counts measured; ``save_dir``: --save, checked for room for its checkpoints."""
    models.quiet_transformers()  # no download/shard progress bars between summary lines
    tokenizer = models.load_tokenizer(model.hf_checkpoint)
    if rollout.data.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise InputError(f"--apply-chat-template: the tokenizer in {model.hf_checkpoint} has "
                         "no chat template; remove the flag or use a chat model")
    # a resumed run starts from the same model; the checkpoint's state replaces its weights
    module = models.load_policy(model.hf_checkpoint, tokenizer, ctx.device, seed=run.seed)
    _check_prompt_lengths(p, tokenizer, module, rollout=rollout, distillation=distillation,
                          evaluation=evaluation)
    # the FLOP counts are the model's own (a LoRA adapter's are not model FLOPs)
    pass_count = (int(passes.needs_old_log_probs(algorithm, batches, distillation))
                  + int(passes.needs_reference(algorithm)))
    p.step_metrics = StepMetrics.measure(module, p.tracker, ctx, peak_tflops=system.peak_tflops,
                                         bf16=p.bf16, log_prob_passes=pass_count,
                                         layout=batches.pass_layout)
    p.step_metrics.padding_note = not batches.use_dynamic_batch_size
    reference = (partial(models.load_reference, model, tokenizer, ctx.device, seed=run.seed,
                         bf16=p.bf16)
                 if passes.needs_reference(algorithm) else None)
    policy = Policy.build(module, ctx, tokenizer,
                          eos_token_ids=models.eos_token_ids(tokenizer, module), bf16=p.bf16,
                          lora=lora, recompute=recompute, fsdp=system.fsdp,
                          optimizer=optimizer, seed=run.seed,
                          base=model.hf_checkpoint, reference=reference,
                          ref_load=model.ref_load)
    if ctx.is_main:
        check_free_space(save_dir, policy.trainable_count())
    return policy


def _check_prompt_lengths(p: _Draft, tokenizer, module, *, rollout, distillation,
                          evaluation) -> None:
    """Training and evaluation prompts must fit the model context with a full response
    (else the prompt's file:line, or its evaluation set and number)."""
    context = getattr(module.config, "max_position_embeddings", None)
    fmt = dict(apply_chat_template=rollout.data.apply_chat_template,
               system_prompt=rollout.data.system_prompt)
    longest = rollout.sampling.rollout_max_response_len
    if p.samples is not None:
        check_formatted_lengths(tokenizer, p.samples, **fmt, context=context, max_response=longest)
        if distillation.self_mode:  # the teacher reads the longer privileged prompts
            check_formatted_lengths(tokenizer, teacher_samples(p.samples), **fmt,
                                    context=context, max_response=longest)
    check_judging_lengths(p.scorer.judge, tokenizer, p.samples, **fmt, max_response=longest)
    for eval_set in p.eval_sets:
        check_formatted_lengths(tokenizer, eval_set.as_samples(), **fmt, context=context,
                                max_response=evaluation.eval_max_response_len,
                                length_flag="--eval-max-response-len")


def _collector(p: _Draft, ctx, layout, side, *, placement, save_dir: str | None, batches, run,
               system, rollout):
    """This rank's collector: the rollout side's assembly on the training rank's own share,
    sampling through the rank's backend, or (--fully-async) the batches the rollout ranks
    sample."""
    pol = p.policy
    if layout is not None:
        # with --save the final checkpoint holds the batches in flight after the last step
        schedule = Schedule(placement.max_staleness, placement.update_weights_interval,
                            p.total_steps, carry=save_dir is not None)
        return RemoteRollout(batches, ctx, layout, schedule, policy=pol, source=p.source,
                             tracker=p.tracker,
                             timeout_minutes=run.distributed_timeout_minutes,
                             bucket_bytes=int(placement.weight_sync_bucket_mb * 2**20),
                             fsdp=system.fsdp)
    [collector] = side.collectors(rollout, batches, p.backend, seed=run.seed,
                                  tokenizer=pol.tokenizer,
                                  eos_token_ids=pol.eos_token_ids, context=pol.context,
                                  timers=[p.timer], trackers=[p.tracker])
    return collector


def _run(p: _Draft, ctx, stop, started: float, resume, console: bool, layout, *, checkpointing,
         system, run, batches, rollout, run_config: dict) -> None:
    """Checkpointer, run control, the resumed state, the metric sinks (``checkpointing``: the
    checkpoint section; ``run_config``: the configuration as a dict, the W&B run's)."""
    if ctx.device.type == "cpu":
        # the host's cores shared between the local ranks (relax/cpu_threads.py)
        torch.set_num_threads(cpu_threads(
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    if ctx.is_main:
        checkpoint.remove_stale_temps(checkpointing.save)
    p.checkpointer = checkpoint.Checkpointer.of(
        checkpointing, ctx, p.policy, fsdp=system.fsdp, rank_state=p.collector.state_dict,
        extra_state=partial(terms_state, p.terms),
        async_group=layout and layout.save_group)  # --fully-async --async-save
    p.control = RunControl(ctx, stop, total_steps=p.total_steps,
                           exit_duration_in_mins=run.exit_duration_in_mins, started=started)
    if resume:
        _resume(p, ctx, *resume, fsdp=system.fsdp, batches=batches, rollout=rollout,
                output_dir=run.output_dir)
    p.logger = build_logger(
        is_main=ctx.is_main, output_dir=run.output_dir, total_steps=p.total_steps,
        start_step=p.start_step, console=console, tensorboard=run.use_tensorboard,
        wandb=run.use_wandb, run_config=run_config, samples=run.log_samples > 0,
    )


def _resume(p: _Draft, ctx, path: str, step: int, *, fsdp: bool, batches, rollout,
            output_dir: str) -> None:
    """The policy's state and this rank's RNG from ``path``; the collector continues where
    the checkpoint left it."""
    progress = load_trainer_state(path, p.policy, fsdp=fsdp, ctx=ctx)
    p.start_step = step
    for term in p.terms:
        term.load(path)
    saved = progress.get("data")
    p.collector.load_state_dict(progress.get("collector") or {
        "cursor": (saved or {}).get("cursor", step * batches.rollout_batch_size)})
    if ctx.is_main:
        report_resume(path, step, saved, p.collector.position(),
                      rollout_batch_size=batches.rollout_batch_size, output_dir=output_dir,
                      fixed_stride=p.group_filter is None and not rollout.partial.partial_rollout,
                      source=p.source)
