"""Is ``--load`` a continuation of this configuration? Checked before any model is loaded;
then the checkpoint's state is loaded into the policy (:func:`load_trainer_state`).

A checkpoint's manifest (``relax_save.json``) records the rollout step, the seed, the
estimator and the resolved configuration of the run that wrote it. :func:`check_resume`
refuses, with one line saying what to change, a checkpoint that this configuration cannot
continue:

- its step lies beyond ``--num-rollout`` (the run would end at once and rewrite the final
  manifest as an earlier step over later weights);
- it was trained with another ``--seed`` or ``--advantage-estimator`` (another run);
- its model is not the ``--hf-checkpoint`` model (another architecture or size: the KL
  reference and the tokenizer come from ``--hf-checkpoint``).

Settings that may legitimately change between the two (a learning rate, a batch size, the
evaluation) are listed in one line, so the log says exactly what is being continued.
"""

from __future__ import annotations

import json
import os
import sys

from relax.config import TrainConfig
from relax.config.files import flatten
from relax.config.section import to_flat, value_of
from relax.errors import InputError
from relax.rollout.partial import deal_carried
from relax.rundirs import SAVE_MARKER
from relax.trainer.distributed import DistContext
from relax.trainer.policy.lora import ALL_LINEAR, hf_target_names
from relax.trainer.runtime import rows_after
from relax.trainer.state import sharded_state
from relax.trainer.state.checkpoint import check_save_dir, latest_checkpoint, read_manifest

# settings that identify a run: changing one makes the checkpoint another run's
IDENTITY = ("seed", "advantage_estimator")
# model config keys that must agree between the checkpoint and --hf-checkpoint
MODEL_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "intermediate_size")
# settings that name places or control this invocation only: never reported as changed
LOCAL = {"load", "save", "output_dir", "dry_run", "num_rollout", "num_epoch", "world_size",
         "device", "use_tensorboard", "use_wandb", "log_samples", "distributed_timeout_minutes",
         "keep_last", "save_interval", "async_save", "checkpoint_checksums"}


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{what}: cannot read {path} ({type(e).__name__})") from None
    if not isinstance(value, dict):
        raise InputError(f"{what}: {path} is not a JSON object")
    return value


def find_resume(checkpoint, *, report: bool) -> tuple[str, int] | None:
    """``--save`` is usable and ``--load`` names a complete checkpoint: (its path, its step),
    or None without ``--load`` (``checkpoint``: the configuration's checkpoint section;
    ``report``: say which candidates were skipped and why)."""
    check_save_dir(checkpoint.save)
    if not checkpoint.load:
        return None
    if not os.path.isdir(checkpoint.load):
        raise InputError(f"--load {checkpoint.load}: no such directory")
    found = latest_checkpoint(checkpoint.load, report=report,
                              checksums=checkpoint.checkpoint_checksums)
    if found is None:
        raise InputError(f"--load {checkpoint.load}: no complete Relax checkpoint in it")
    return found


def check_resume(cfg, checkpoint: str, step: int, total_steps: int) -> str | None:
    """Raise :class:`InputError` if ``checkpoint`` (at rollout ``step``) cannot be continued by
    ``cfg``; else return a line naming the changed settings (None when nothing changed)."""
    where = f"--load {cfg.checkpoint.load}"
    if step > total_steps:
        raise InputError(f"{where}: the checkpoint {checkpoint} is at rollout step {step}, "
                         f"beyond this run's {total_steps} steps; raise --num-rollout above "
                         f"{step} to continue it (relax eval evaluates it as it is)")
    manifest = _read_json(os.path.join(checkpoint, SAVE_MARKER), where)
    saved = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    saved = flatten(saved, TrainConfig, where, strict=False)  # by section, or flat (older)
    recorded = {"seed": (manifest.get("progress") or {}).get("seed", saved.get("seed")),
                "advantage_estimator": manifest.get("advantage_estimator",
                                                    saved.get("advantage_estimator"))}
    for key in IDENTITY:
        if recorded[key] is not None and recorded[key] != value_of(cfg, key):
            flag = "--" + key.replace("_", "-")
            raise InputError(f"{where}: the checkpoint was trained with {flag} {recorded[key]}, "
                             f"this run has {flag} {value_of(cfg, key)}; resume with {flag} "
                             f"{recorded[key]}, or start a new run without --load")
    _check_model(cfg.model.hf_checkpoint, checkpoint, where)
    # an adapter checkpoint holds the adapter only, a full one no adapter: neither loads
    # into the other's model
    saved_rank = int(saved.get("lora_rank") or 0)
    if saved_rank != cfg.lora.lora_rank:
        was = f"--lora-rank {saved_rank}" if saved_rank else "full fine-tuning"
        raise InputError(f"{where}: the checkpoint was trained with {was}, this run has "
                         f"--lora-rank {cfg.lora.lora_rank}; resume with "
                         f"{'--lora-rank ' + str(saved_rank) if saved_rank else 'no --lora-rank'}"
                         ", or start a new run without --load")
    _check_trained_tensors(cfg.lora, saved, where)
    now = to_flat(cfg)
    changed = [f"--{k.replace('_', '-')} {saved[k]} -> {now[k]}"
               for k in sorted(saved) if k not in LOCAL and k not in IDENTITY
               and k in now and saved[k] != _jsonable(now[k])]
    if not changed:
        return None
    return (f"relax train: continuing {checkpoint} (step {step}) with changed settings: "
            + ", ".join(changed))


def _check_trained_tensors(lora, saved: dict, where: str) -> None:
    """The adapter's layers are the tensors a LoRA checkpoint holds: other target modules
    would drop trained adapters and start others from zero, so they are refused (Megatron and
    Hugging Face names of the same layers are the same targets). ``lora``: this run's LoRA
    section."""
    if not lora.lora_rank or "lora_target_modules" not in saved:
        return
    before, now = saved.get("lora_target_modules"), lora.lora_target_modules
    layers_before = set(hf_target_names(list(before or ALL_LINEAR)))
    layers_now = set(hf_target_names(list(now or ALL_LINEAR)))
    if layers_before == layers_now:
        return
    dropped, new = sorted(layers_before - layers_now), sorted(layers_now - layers_before)
    what = "; ".join(x for x in (
        f"its adapters on {', '.join(dropped)} would be dropped" if dropped else "",
        f"adapters on {', '.join(new)} would start untrained" if new else "") if x)
    flag = "--lora-target-modules"
    resume_with = f"{flag} {' '.join(before)}" if before else f"no {flag} (all linear layers)"
    raise InputError(f"{where}: the checkpoint trained LoRA adapters on "
                     f"{', '.join(sorted(layers_before))}, this run targets "
                     f"{', '.join(sorted(layers_now))} ({what}); resume with {resume_with}, or "
                     "start a new run without --load")


def _jsonable(value):
    return json.loads(json.dumps(value))


def _check_model(hf_checkpoint: str | None, checkpoint: str, where: str) -> None:
    """The checkpoint's model is the ``hf_checkpoint`` model (--hf-checkpoint)."""
    if hf_checkpoint is None:
        return
    mine = _read_json(os.path.join(checkpoint, "config.json"), where)
    base = _read_json(os.path.join(hf_checkpoint, "config.json"),
                      f"--hf-checkpoint {hf_checkpoint}")
    differ = [k for k in MODEL_KEYS if k in mine and k in base and mine[k] != base[k]]
    if differ:
        k = differ[0]
        raise InputError(f"{where}: the checkpoint's model differs from --hf-checkpoint "
                         f"{hf_checkpoint} ({k} {mine[k]} vs {base[k]}); the reference "
                         "model and the tokenizer come from --hf-checkpoint, so point it at the "
                         "model this run started from")


def report_resume(path: str, step: int, saved: dict | None, position: dict, *,
                  rollout_batch_size: int, output_dir: str, fixed_stride: bool,
                  source) -> None:
    """Say where the resumed run stands (rank 0), and warn when ``metrics.jsonl`` holds rows
    of the interrupted run past ``step`` or the data position no longer matches the
    checkpoint's. ``position``: the collector's (epoch, index, cursor); ``fixed_stride``: every
    step consumes ``rollout_batch_size`` prompts (no dynamic sampling rounds); ``output_dir``:
    --output-dir, where ``metrics.jsonl`` is."""
    now = {k: position[k] for k in ("epoch", "index")}
    if saved is not None:
        saved = {k: saved[k] for k in ("epoch", "index") if k in saved}
    if fixed_stride and position["cursor"] != step * rollout_batch_size:
        now = source.position(step)  # another --rollout-batch-size: warn below
    print(f"relax train: resuming from {path} at rollout step {step} "
          f"(data epoch {now['epoch']}, prompt {now['index']} of the epoch)", file=sys.stderr)
    metrics = os.path.join(output_dir, "metrics.jsonl")
    stale = rows_after(metrics, step)
    if stale:
        print(f"relax train: {metrics} holds {stale} rows of steps after {step} from the "
              "interrupted run; the rows this run appends supersede them (readers keep the "
              "last row of each step)", file=sys.stderr)
    if saved is not None and saved != now:
        print(f"relax train: warning: the checkpoint was at data position {saved}, this "
              f"configuration puts step {step} at {now} (--rollout-batch-size or the data "
              "changed?); the run is no longer an exact continuation", file=sys.stderr)


def load_trainer_state(path: str, policy, *, fsdp: bool, ctx: DistContext) -> dict:
    """Restore the policy's checkpointed state (relax/trainer/policy/bundle.py) and this rank's RNG
    states; return the saved progress.

    Another world size or ``--fsdp`` setting loads the same weights and optimizer state
    (DCP reshards them); what that means for exactness is printed once.
    """
    meta = read_manifest(path)
    policy.load_checkpoint_state(path)
    saved_world, saved_fsdp = int(meta["world_size"]), bool(meta.get("fsdp"))
    rng, collector = sharded_state.read_rank_file(path, ctx.rank % saved_world)
    dealt = ""
    if saved_world != ctx.world_size:
        # partial rollouts in flight: every saved rank's groups, dealt out over these ranks
        states = [sharded_state.read_rank_file(path, r)[1] for r in range(saved_world)]
        collector = deal_carried(states, ctx.rank, ctx.world_size)
        if collector is not None:
            dealt = (f"; the {sum(len(s['carried']) for s in states)} partial rollout groups "
                     "in flight are dealt out over the new ranks")
    if ctx.is_main and saved_world != ctx.world_size:
        print(f"relax train: --load {path}: saved with {saved_world} ranks, resuming with {ctx.world_size}: "
              "weights and optimizer state are restored exactly, but each rank now samples "
              "other prompts with other seeds (RNG states are reused by rank modulo), so the "
              f"run continues correctly but not as an exact continuation{dealt}",
              file=sys.stderr, flush=True)
    elif ctx.is_main and saved_fsdp != fsdp:
        print(f"relax train: --load {path}: saved {'with' if saved_fsdp else 'without'} --fsdp, resuming "
              f"{'with' if fsdp else 'without'}: weights and optimizer state are restored "
              "exactly; gradient sums are reduced in another order, so later steps agree with "
              "the interrupted run only up to float rounding", file=sys.stderr, flush=True)
    sharded_state.set_rng_state(rng)
    progress = dict(meta.get("progress") or {})
    if collector is not None:
        progress["collector"] = collector  # partial rollouts in flight, this rank's share
    return progress
