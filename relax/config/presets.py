"""The built-in preset: what a bare ``relax train`` runs.

When neither ``--hf-checkpoint`` nor ``--prompt-data`` is given, Relax trains the
built-in tiny model on a built-in task. The default flag values are sized for a real
model (``--lr 1e-6``, ``--rollout-max-response-len 1024``), which would learn nothing
on the tiny model in a few CPU minutes, so each key below replaces the flag's default
unless the user gave that flag (on the command line or in a ``--config`` file). The values are visible in the
``--dry-run`` JSON and documented in ``docs/configuration.md``.

Keys are config field names (flag name without ``--``, ``-`` -> ``_``). The trainer owner
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


def preset_values(values: dict, explicit: set[str]) -> dict | None:
    """The preset's values for the flags the user did not pass, or None when the run uses a
    user model or user data (the preset does not apply).

    ``values`` are the parsed flags by field name, ``explicit`` the fields given on the command
    line or in a ``--config`` file. ``--num-steps-per-rollout`` given alone derives the global batch from it, so a preset
    ``global_batch_size`` must then stay out of the way.
    """
    if values["hf_checkpoint"] is not None or values["prompt_data"] is not None:
        return None
    return {key: value for key, value in BUILTIN_PRESET.items()
            if key not in explicit
            and not (key == "global_batch_size" and "num_steps_per_rollout" in explicit)}
