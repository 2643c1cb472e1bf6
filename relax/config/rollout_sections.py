"""The rollout section and its parts: where prompts come from (``data``), how responses are
sampled (``sampling``), scored (``rewards``, relax/config/reward_services.py), played as
episodes (``episodes``), corrected off-policy (``off_policy``, reinforce_plus_plus.md §7a),
carried over unfinished (``partial``), and who samples (``backend``,
relax/config/rollout_backend.py). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.gym_spec import ANSWER_FORMATS
from relax.config.presets import BUILTIN_TASK_NAMES
from relax.config.reward_services import RewardsSection
from relax.config.rollout_backend import BackendSection
from relax.config.section import Section, option, section


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
        default_note='the preset may change it')
    input_key: str = option(
        'input',
        "Prompt field of the prompt files' records.")
    label_key: str = option(
        'label',
        "Label field of the prompt files' records, passed to the reward.")
    apply_chat_template: bool = option(
        False,
        "Wrap prompts in the model tokenizer's chat template.")
    system_prompt: str | None = option(
        None,
        'System message: in the chat template with --apply-chat-template, else a line before '
        'the prompt.')
    reasoning_gym_answer: str = option(
        'tags',
        'How the answer of a reasoning-gym source is read: tags, last_number or boxed.',
        choices=ANSWER_FORMATS,
        default_note="reasoning-gym's <answer> tags and system prompt")
    shuffle: bool = option(
        False,
        'Shuffle --prompt-data each epoch (seeded).',
        flag='rollout_shuffle')


@dataclass(frozen=True)
class SamplingSection(Section):
    """How the rollout samples its responses."""

    max_response_len: int = option(
        1024,
        'Maximum generated tokens per response; longer ones are truncated.',
        flag='rollout_max_response_len',
        bound=(lambda v: v >= 1, "must be >= 1 tokens"))
    temperature: float = option(
        1.0,
        'Sampling temperature > 0.',
        flag='rollout_temperature',
        bound=(lambda v: v > 0.0, "must be > 0; use 1.0 for plain sampling"))
    top_p: float = option(
        1.0,
        'Nucleus sampling mass in (0, 1].',
        flag='rollout_top_p',
        default_note='off',
        bound=(lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 to turn it off"))
    top_k: int = option(
        -1,
        'Top-k sampling, >= 1 or -1.',
        flag='rollout_top_k',
        default_note='off',
        bound=(lambda v: v == -1 or v >= 1, "must be >= 1, or -1 to turn top-k off"))


@dataclass(frozen=True)
class EpisodesSection(Section):
    """Multi-turn episodes: an environment (``--env``) or an agent program's tools answer
    (relax/rollout/agents/envs.py, agent_server.py)."""

    env: str | None = option(
        None,
        'Multi-turn episodes against an environment: gem:ID, textarena:ID (make install brings'
        " both) or 'module:factory' / 'file.py:factory' (relax/rollout/agents/envs.py); excludes "
        'prompt data and the reward flags (the environment scores the episode).',
        default_note='single-turn prompts')
    max_turns: int = option(
        4,
        'Most model turns per --env or --use-agentic-rollout episode; each turn generates at '
        'most the response length (--rollout-max-response-len; in evaluation '
        '--eval-max-response-len).',
        bound=(lambda v: v >= 1, "must be >= 1 model turns per episode"))
    step_timeout: float | None = option(
        None,
        "Seconds, in (0, 86400], that one call of an --env environment's code (its factory, "
        'reset or step) may take; the call runs on a worker thread, one that runs over fails '
        'its episode (at start-up: exit 2) and is abandoned, and a fresh environment from the '
        'factory plays the next episode (relax/rollout/agents/env_guard.py).',
        flag='env_step_timeout',
        metavar='SECONDS',
        default_note='reset and step unbounded, on the main thread; the factory 600 s',
        bound=(lambda v: v is None or 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); leave it out for no limit"))
    agentic: bool = option(
        False,
        'Each episode is a run of --agent-command against an OpenAI-compatible endpoint on '
        '127.0.0.1 that samples from the policy and records the conversation '
        'token-in/token-out (relax/rollout/agents/agent_server.py).',
        flag='use_agentic_rollout')
    agent_command: str | None = option(
        None,
        'The agent program, started once per episode with RELAX_BASE_URL, RELAX_SESSION_ID, '
        'RELAX_INPUT_JSON and RELAX_OUTPUT_JSON in its environment; needs '
        '--use-agentic-rollout.')
    agent_timeout: float = option(
        600.0,
        'Seconds an agent episode may run; then its process group is killed and the episode '
        'fails (reward 0).',
        bound=(lambda v: 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); the default is 600"))


@dataclass(frozen=True)
class OffPolicySection(Section):
    """The sampler's log-probs: mismatch metrics and importance correction
    (reinforce_plus_plus.md §7a)."""

    use_rollout_logprobs: bool = option(
        False,
        "pi_old of the PPO ratio is the sampler's log-prob of each token (kept by the decode, "
        "no extra pass) instead of the trainer's; rejected for rloo (no ratio).")
    mismatch_metrics: bool | None = option(
        None,
        'rollout/logprob_abs_diff (mean, max), rollout/mismatch_k1, _k3 and _ratio_outside '
        "between the sampler's and the trainer's log-probs of the trained tokens; "
        '--no-get-mismatch-metrics turns them off.',
        flag='get_mismatch_metrics',
        default_text='on (free: elementwise over log-probs the update already holds)')
    use_tis: bool = option(
        False,
        "Truncated importance sampling: each token's policy loss times clamp(pi_trainer / "
        'pi_sampler, --tis-clip-low, --tis-clip), a constant.')
    tis_clip: float = option(
        2.0,
        'Upper clip of the TIS weight, > 0, at most 3.4e38 (float32); needs --use-tis.')
    tis_clip_low: float = option(
        0.0,
        'Lower clip of the TIS weight, in [0, --tis-clip]; needs --use-tis.')
    custom_tis_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' computing the TIS weights: "
        'f(trainer_log_probs, sampler_log_probs, mask) -> weights [B, T], finite and >= 0 on '
        'the mask; needs --use-tis.',
        flag='custom_tis_function_path')
    use_opsm: bool = option(
        False,
        'Off-policy sequence masking: drop from the policy loss a response with a negative '
        'advantage whose mean log(pi_sampler / pi_theta) exceeds --opsm-delta.')
    opsm_delta: float = option(
        0.0001,
        'OPSM threshold, > 0; needs --use-opsm.')


@dataclass(frozen=True)
class PartialSection(Section):
    """Partial rollouts: unfinished groups continue in the next step
    (relax/rollout/partial.py)."""

    enabled: bool = option(
        False,
        'Start --over-sampling-batch-size groups per step, stop decoding once '
        '--rollout-batch-size of them are complete, and continue the unfinished ones in the '
        'next step under the newer policy (relax/rollout/partial.py); deterministic: the stop '
        'counts tokens, not time.',
        flag='partial_rollout')
    max_aborted_count: int = option(
        2,
        'Most steps one group may be carried over unfinished; a step waits for groups at the '
        'bound. Needs --partial-rollout.',
        flag='partial_rollout_max_aborted_count')
    mask_off_policy: bool = option(
        False,
        'Leave tokens an earlier step sampled out of the loss (they stay in the context); '
        'without it --use-tis or --use-rollout-logprobs must weigh them. Needs '
        '--partial-rollout.',
        flag='mask_offpolicy_in_partial_rollout')


@dataclass(frozen=True)
class RolloutSection(Section):
    """What the rollout collects, how it samples and scores, and who samples."""

    data: DataSection = section(DataSection)
    sampling: SamplingSection = section(SamplingSection)
    rewards: RewardsSection = section(RewardsSection)
    episodes: EpisodesSection = section(EpisodesSection)
    off_policy: OffPolicySection = section(OffPolicySection)
    partial: PartialSection = section(PartialSection)
    backend: BackendSection = section(BackendSection)
