"""The episodes section (``cfg.rollout.episodes``): multi-turn episodes against an ``--env``
environment or run by ``--use-agentic-rollout`` agent programs, with their rules (the flags
each needs, and the flags neither reads). Torch-free."""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass

from relax.config.checks import check_env_name
from relax.config.section import Needs, Section, flag_of, option, reject, value_of

MAX_TURNS = 10_000  # --max-turns: a bound far above any real episode, so a typo is one line


def _agentic(cfg) -> bool:
    return cfg.rollout.episodes.use_agentic_rollout


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
        bound=((lambda v: v >= 1, "must be >= 1 model turns per episode"),
               (lambda v: v <= MAX_TURNS, f"must be <= {MAX_TURNS} model turns per episode")),
        requires=Needs(lambda cfg: cfg.rollout.episodes.env is not None
                       or cfg.rollout.episodes.use_agentic_rollout,
                       "only applies to --env or --use-agentic-rollout episodes; add one or "
                       "remove it"))
    env_step_timeout: float | None = option(
        None,
        "Seconds, in (0, 86400], that one call of an --env environment's code (its factory, "
        'reset or step) may take; the call runs on a worker thread, one that runs over fails '
        'its episode (at start-up: exit 2) and is abandoned, and a fresh environment from the '
        'factory plays the next episode (relax/rollout/agents/env_guard.py).',
        metavar='SECONDS',
        default_note='reset and step unbounded, on the main thread; the factory 600 s',
        bound=(lambda v: v is None or 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); leave it out for no limit"),
        requires=Needs(lambda cfg: cfg.rollout.episodes.env is not None,
                       "only applies to --env environments; add --env or remove it (agent "
                       "programs have --agent-timeout)", given="changed"))
    use_agentic_rollout: bool = option(
        False,
        'Each episode is a run of --agent-command against an OpenAI-compatible endpoint on '
        '127.0.0.1 that samples from the policy and records the conversation '
        'token-in/token-out (relax/rollout/agents/agent_server.py).')
    agent_command: str | None = option(
        None,
        'The agent program, started once per episode with RELAX_BASE_URL, RELAX_SESSION_ID, '
        'RELAX_INPUT_JSON and RELAX_OUTPUT_JSON in its environment; needs '
        '--use-agentic-rollout.',
        requires=Needs(_agentic, "only applies to --use-agentic-rollout; add it or remove "
                       "--agent-command"))
    agent_timeout: float = option(
        600.0,
        'Seconds an agent episode may run; then its process group is killed and the episode '
        'fails (reward 0).',
        bound=(lambda v: 0.0 < v <= 86400.0, "must lie in (0, 86400] seconds (one day); the default is 600"),
        requires=Needs(_agentic, "only applies to --use-agentic-rollout; add it or remove "
                       "--agent-timeout"))

    def check(self) -> None:
        if self.env is not None:
            if self.use_agentic_rollout:
                reject(self, ("env", "use_agentic_rollout"), "two episode sources; keep one")
            check_env_name(self)
        if self.use_agentic_rollout:
            self._check_agent_command()

    def _check_agent_command(self) -> None:
        """The command can start (nothing is run)."""
        if self.agent_command is None:
            reject(self, "use_agentic_rollout", "needs --agent-command CMD, the agent program "
                   "to run per episode")
        try:
            argv = shlex.split(self.agent_command)
        except ValueError as e:
            reject(self, "agent_command", f"cannot be split into arguments ({e}); check the "
                   "quotes")
        program = argv[0] if argv else ""
        found = (os.path.isfile(program) and os.access(program, os.X_OK)) if os.sep in program \
            else shutil.which(program) is not None
        if not found:
            reject(self, "agent_command", f"{program!r} is not an executable file or a program "
                   "on PATH; give a command that starts, e.g. 'python my_agent.py'")

# ------------------------------------------------------------------ rules across sections

def check_env_scope(cfg, explicit: set[str]) -> None:
    """Sections rollout.episodes, system, rollout.data, rollout.rewards, evaluation: the
    environment makes the prompts and scores the episodes, so prompt data and reward flags
    have nothing to do; episodes end at different turns, so no sharded generation."""
    if cfg.rollout.episodes.env is None:
        return
    if cfg.system.fsdp:
        reject(cfg, ("env", "fsdp"), "sharded generation needs every rank to run the same "
               "number of forward passes, and episodes end at different turns; remove --fsdp")
    for dest in ("prompt_data", "rm_type", "custom_rm_path", "builtin_task",
                 "eval_prompt_data"):
        if dest in explicit and value_of(cfg, dest) is not None:
            why = ("evaluation plays --eval-episodes episodes of held-out environment seeds"
                   if dest == "eval_prompt_data" else
                   "the environment makes the prompts and scores the episodes")
            reject(cfg, ("env", dest), f"{why}; remove {flag_of(dest)}")


def check_agent_scope(cfg, explicit: set[str]) -> None:
    """Sections rollout.episodes, rollout.rewards, rollout.data, evaluation, system: flags that
    only the trainer's own prompt formatting or reward would read are rejected (the agent
    writes the messages and reports the reward)."""
    if not cfg.rollout.episodes.use_agentic_rollout:
        return
    for dest in ("rm_type", "custom_rm_path", "apply_chat_template", "system_prompt",
                 "eval_interval", "fsdp"):
        if value_of(cfg, dest) not in (None, False):
            why = {"eval_interval": "evaluation runs on prompts, not agent episodes",
                   "fsdp": "sharded generation needs every rank to run the same number of "
                           "forward passes, and agents call at their own pace"}.get(
                dest, "the agent writes the messages and reports the reward")
            reject(cfg, ("use_agentic_rollout", dest), f"{why}; remove {flag_of(dest)}")
