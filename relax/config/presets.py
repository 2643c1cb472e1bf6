"""The built-in preset: what a bare ``relax train`` runs.

When neither ``--hf-checkpoint`` nor ``--prompt-data`` is given, Relax trains the
built-in tiny model on a built-in task. The default flag values are sized for a real
model (``--lr 1e-6``, ``--rollout-max-response-len 1024``), which would learn nothing
on the tiny model in a few CPU minutes, so each key below replaces the flag's default
unless the user passed that flag explicitly. The values are visible in the
``--dry-run`` JSON and documented in ``docs/configuration.md``.

Keys are argparse dests (flag name without ``--``, ``-`` -> ``_``). The trainer owner
tunes the values here; a key added here must be an existing flag (a test checks it).
"""

from __future__ import annotations

# Built-in tasks (relax.rollout owns their data and rewards); also valid --rm-type values.
BUILTIN_TASK_NAMES: tuple[str, ...] = ("copy", "addition")

# Tuned on 2 CPU cores (see the trainer report / README): 16 prompts x 8 samples of the
# `copy` task, responses of at most 5 characters, 200 rollout steps. With every contract recipe
# (grpo, reinforce_plus_plus, reinforce_plus_plus_baseline) the reward climbs from ~0.01 to
# ~0.4-0.5 in well under the 3-minute budget.
BUILTIN_PRESET: dict[str, object] = {
    "lr": 3e-3,
    "rollout_batch_size": 16,
    "n_samples_per_prompt": 8,
    "num_rollout": 200,
    "rollout_max_response_len": 5,
    "builtin_task": "copy",
}


def preset_applies(ns) -> bool:
    """True when the run uses neither a user model nor user data."""
    return ns.hf_checkpoint is None and ns.prompt_data is None


def apply_builtin_preset(ns, explicit: set[str]) -> bool:
    """Overwrite, in place, each preset key the user did not pass; return whether applied.

    ``explicit`` holds the dests given on the command line. ``--num-steps-per-rollout``
    given alone derives the global batch from it, so a preset ``global_batch_size``
    must then stay out of the way.
    """
    if not preset_applies(ns):
        return False
    for key, value in BUILTIN_PRESET.items():
        if key in explicit:
            continue
        if key == "global_batch_size" and "num_steps_per_rollout" in explicit:
            continue
        setattr(ns, key, value)
    return True
