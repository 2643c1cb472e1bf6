"""The fields of the configuration: ``option(...)`` (a flag's one default and its help),
the argument groups of ``--help``, how a default is written ("Default X.", :func:`help_text`),
and the fields ``relax train`` and ``relax eval`` share (relax/config/schema.py uses them).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

from relax.config.gym_spec import ANSWER_FORMATS
from relax.config.presets import BUILTIN_TASK_NAMES

DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
RM_TYPES: tuple[str, ...] = ("math", "remote_rm", "genrm", *BUILTIN_TASK_NAMES)

# Argument groups of ``relax train --help``, in order.
GROUPS: dict[str, str] = {
    "algorithm": "Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7).",
    "batches": "Sizes in prompts and samples (responses).",
    "model and data": "Defaults: the built-in tiny model and task.",
    "off-policy": "The sampler's log-probs: mismatch metrics and importance correction "
                  "(reinforce_plus_plus.md §7a).",
    "distillation": "On-policy distillation: a frozen teacher's log-probs of the student's "
                    "own tokens in the advantage (reinforce_plus_plus.md §7b).",
    "critic": "PPO's learned critic: GAE, the clipped value loss and the critic's own "
              "optimizer (reinforce_plus_plus.md §5c).",
    "lora": "Low-rank adapters instead of full fine-tuning (peft).",
    "optimizer": "AdamW, constant learning rate.",
    "recompute": "Activation recompute of the policy's training forward: less memory for one "
                 "more forward of the recomputed layers (Megatron's flag names).",
    "modes": "Synchronous colocate training, or --fully-async (reinforce_plus_plus.md §9).",
    "async": "Fully asynchronous training (--fully-async): rollout ranks and training ranks "
             "under one torchrun, weights synced over torch.distributed, a fixed staleness.",
    "rollout backend": "Who samples: Relax's decode engine or vLLM servers fed the trainer's "
                       "weights (docs/configuration.md, \"Rollout backend\").",
    "evaluation": "Periodic evaluation during training: pass@k (unbiased) and mean reward on "
                  "held-out prompts (docs/configuration.md).",
    "environments": "Multi-turn episodes: the model acts, an environment or an agent program's "
                    "tools answer (relax/rollout/envs.py, episodes.py, agent_server.py).",
    "rewards": "Rewards served outside the trainer's reward function: a remote reward model, a "
               "generative judge, group rewards (docs/reward_services.md).",
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

def eval_prompt_data_option():
    return option(None, "PATH, or NAME "
                  "PATH pairs, of .jsonl/.parquet prompt files or reasoning-gym:NAME sources; "
                  "fields --input-key / --label-key, scored with the run's reward.",
                  default_text="the built-in task's fixed evaluation prompts",
                  group="evaluation", nargs="+", metavar="[NAME] PATH")


def n_samples_per_eval_prompt_option():
    return option(1, "Responses per evaluation prompt; pass@k is logged for k = 1, "
                  "2, 4, ... up to this number.", group="evaluation")


def _follows(what: str, fallback: str, rest: str):
    """An evaluation sampling flag whose default follows the rollout's (relax/config/eval_flags.py)."""
    return option(None, rest, group="evaluation",
                  default_text=f"in relax train the rollout's {what}, in relax eval {fallback}")


def eval_temperature_option():
    return _follows("temperature", "1.0", "Sampling temperature >= 0; 0 is greedy.")


def eval_top_p_option():
    return _follows("top-p", "1.0", "Nucleus sampling mass in (0, 1].")


def eval_top_k_option():
    return _follows("top-k", "-1 (off)", "Top-k sampling, >= 1 or -1.")


def eval_max_response_len_option():
    return _follows("maximum response length", "1024 (the preset's for the built-in task)",
                    "Maximum generated tokens per evaluation response.")


def eval_batch_size_option():
    return option(64, "Sequences (prompts x samples) per generation call.",
                  group="evaluation")


def eval_pass_threshold_option():
    return option(1.0, "A response passes (counts for pass@k) when its reward is "
                  ">= this.", group="evaluation")


def env_option():
    return option(
        None, "Multi-turn episodes against an environment: "
        "gem:ID, textarena:ID (make install brings both) or 'module:factory' / "
        "'file.py:factory' (relax/rollout/envs.py); excludes prompt data and the reward flags "
        "(the environment scores the episode).",
        default_note='single-turn prompts', group="environments")


def max_turns_option():
    return option(
        4, "Most model turns per --env or --use-agentic-rollout episode; each turn "
        "generates at most the response length (--rollout-max-response-len; in evaluation "
        "--eval-max-response-len).", group="environments")


def env_step_timeout_option():
    return option(
        None, "Seconds, in (0, 86400], that one call of an --env environment's code (its "
        "factory, reset or step) may take; the call runs on a worker thread, one that runs "
        "over fails its episode (at start-up: exit 2) and is abandoned, and a fresh environment "
        "from the factory plays the next episode (relax/rollout/env_guard.py).",
        metavar="SECONDS", default_note="reset and step unbounded, on the main thread; the "
        "factory 600 s", group="environments")


def eval_episodes_option():
    return option(
        64, "With --env: episodes of the held-out environment seeds 1000000000, "
        "1000000001, ... an evaluation plays (--n-samples-per-eval-prompt plays each); an "
        "episode passes when its reward is >= --eval-pass-threshold.", group="evaluation")


def input_key_option():
    return option("input", "Prompt field of the prompt files' records.",
                  group="model and data")


def label_key_option():
    return option("label", "Label field of the prompt files' records, passed to "
                  "the reward.", group="model and data")


def reasoning_gym_answer_option():
    return option("tags", "How "
                  "the answer of a reasoning-gym source is read: tags, last_number or boxed.",
                  default_note="reasoning-gym's <answer> tags and system prompt",
                  group="model and data", choices=ANSWER_FORMATS)


def apply_chat_template_option():
    return option(False, "Wrap prompts in the model tokenizer's chat template.",
                  group="model and data")


def system_prompt_option():
    return option(None, "System message: in the chat template with "
                  "--apply-chat-template, else a line before the prompt.", group="model and data")


def rm_type_option():
    return option(None, "Reward for prompt files: math "
                  "(math-verify answer check), remote_rm (relax train: the --rm-url server), "
                  "genrm (relax train: the --genrm-model-path judge) "
                  "or a built-in task's reward.",
                  default_text="the built-in task's reward", group="model and data",
                  choices=RM_TYPES)


def custom_rm_path_option():
    return option(None, "'module:function' or 'file.py:function' reward; "
                  "excludes --rm-type.", group="model and data")


def builtin_task_option():
    return option(BUILTIN_TASK_NAMES[0], "Built-in task used without prompt files.",
                  default_note="the preset may change it", group="model and data",
                  choices=BUILTIN_TASK_NAMES)


def seed_option():
    return option(1234, "Seed of every RNG.", group="optimizer")


def bf16_option():
    return option(None, "Forward passes under bf16 "
                  "autocast; fp32 master weights, AdamW state and log-prob math; reference "
                  "stored in bf16.", default_text='on with CUDA, off on the CPU', group="modes")


def device_option():
    return option("auto", "", default_note="cuda when available, else cpu", group="modes",
                  choices=DEVICES)


def host_mmap_threshold_kb_option():
    return option(0, "Host (CPU) memory blocks of at least this many KiB get their own "
                  "memory map and go back to the OS when freed (glibc's M_MMAP_THRESHOLD, "
                  "fixed; relax/host_memory.py). Turn it on (128) when host memory binds: "
                  "glibc's dynamic threshold keeps freed tensors in a fragmenting heap, so a "
                  "CPU run's peak RSS can be twice its live tensors; a fixed one trades that "
                  "for page faults (SmolLM2, 16 x 256 with recompute: peak 6.2 -> 3.3 GiB, "
                  "step time +20-27 percent; docs/performance.md). 0: glibc's dynamic one.",
                  default_note="glibc's dynamic threshold", group="modes")
