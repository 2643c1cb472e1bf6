"""The data section (``cfg.rollout.data``): where prompts come from (files, a reasoning-gym
source or the built-in task) and how they are formatted, with their rules. Torch-free."""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.checks import check_gym_answer, check_gym_spec
from relax.config.gym_spec import ANSWER_FORMATS, is_reasoning_gym
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.section import Needs, Section, flag_of, option, reject
from relax.config.sections.evaluation import resolved_train_eval


def _has_prompt_data(cfg) -> bool:
    return cfg.rollout.data.prompt_data is not None


def _needs_prompt_data(dest: str) -> Needs:
    return Needs(_has_prompt_data, lambda cfg: (
        f"only applies to --prompt-data; the built-in task {cfg.rollout.data.builtin_task!r} "
        f"is generated, remove {flag_of(dest)}"), given="changed")


def _record_key_needs(dest: str) -> tuple[Needs, ...]:
    """A record key needs prompt files (not the built-in task, not a reasoning-gym source)."""
    return (Needs(lambda cfg: not is_reasoning_gym(cfg.rollout.data.prompt_data),
                  "a reasoning-gym source has no record keys; remove it"),
            _needs_prompt_data(dest))


@dataclass(frozen=True)
class DataSection(Section):
    """Prompts: files, a reasoning-gym source or the built-in task."""

    prompt_data: str | None = option(
        None,
        'Prompt file (.jsonl or .parquet; needs --rm-type or --custom-rm-path), or '
        'reasoning-gym:NAME?key=value&... (a reasoning-gym dataset, scored by its own verifier'
        ' unless a reward flag is given).',
        default_text='the built-in task')
    builtin_task: str | None = option(
        BUILTIN_TASK_NAMES[0],
        'Built-in task used without prompt files.',
        choices=BUILTIN_TASK_NAMES,
        default_note='the preset may change it',
        requires=Needs(lambda cfg: cfg.rollout.data.prompt_data is None,
                       "is only used without --prompt-data; remove one of them"))
    input_key: str = option(
        'input',
        "Prompt field of the prompt files' records.",
        requires=_record_key_needs("input_key"))
    label_key: str = option(
        'label',
        "Label field of the prompt files' records, passed to the reward.",
        requires=_record_key_needs("label_key"))
    apply_chat_template: bool = option(
        False,
        "Wrap prompts in the model tokenizer's chat template.",
        requires=Needs(lambda cfg: cfg.model.hf_checkpoint is not None,
                       "the built-in tiny model has no chat template; add --hf-checkpoint or "
                       "remove --apply-chat-template", given="changed"))
    system_prompt: str | None = option(
        None,
        'System message: in the chat template with --apply-chat-template, else a line before '
        'the prompt.')
    reasoning_gym_answer: str = option(
        'tags',
        'How the answer of a reasoning-gym source is read: tags, last_number or boxed.',
        choices=ANSWER_FORMATS,
        default_note="reasoning-gym's <answer> tags and system prompt")
    rollout_shuffle: bool = option(
        False,
        'Shuffle --prompt-data each epoch (seeded).',
        requires=_needs_prompt_data("rollout_shuffle"))

    def check(self) -> None:
        if self.prompt_data is None:
            return
        if is_reasoning_gym(self.prompt_data):
            check_gym_spec(self.prompt_data, "--prompt-data", role="train")
        elif not os.path.isfile(self.prompt_data):
            reject(self, "prompt_data", "no such file; give a .jsonl or .parquet prompt file, "
                   "or reasoning-gym:NAME")


# ------------------------------------------------------------------ rules across sections

def check_prompt_reward(cfg, explicit: set[str]) -> None:
    """Sections rollout.data, rollout.rewards, rollout.episodes: prompt files need a reward, the
    built-in task brings its own."""
    data, rewards = cfg.rollout.data, cfg.rollout.rewards
    if data.prompt_data is not None:
        if (not is_reasoning_gym(data.prompt_data) and rewards.rm_type is None
                and rewards.custom_rm_path is None
                and not cfg.rollout.episodes.use_agentic_rollout):
            reject(cfg, "prompt_data", "needs a reward; add --rm-type math or --custom-rm-path "
                   "module:function")
    elif rewards.rm_type is not None and rewards.rm_type != data.builtin_task:
        reject(cfg, "rm_type", f"the built-in task {data.builtin_task!r} brings its own reward;"
               f" remove --rm-type or give --prompt-data")


def check_gym_answers(cfg, explicit: set[str]) -> None:
    """Sections rollout.data, rollout.rewards, evaluation: --reasoning-gym-answer needs a
    reasoning-gym source scored by its own verifier."""
    check_gym_answer(cfg, explicit, [cfg.rollout.data.prompt_data, *(
        p for _, p in resolved_train_eval(cfg)["eval_prompt_data"] or ())])
