"""Rules of the episode sources: ``--env`` environments and ``--use-agentic-rollout`` agent
programs (the flags each needs, and the flags neither reads). Called by validate.py in its
ordered list; each error is one line naming the flag."""

from __future__ import annotations

import os
import shlex
import shutil

from relax.config.checks import check_env_name, flag_of, reject
from relax.config.section import value_of


def check_env(cfg, explicit: set[str]) -> None:
    """``--env``: the library is installed or the factory exists (nothing is imported); the
    environment scores the episodes, so prompt data and reward flags have nothing to do."""
    if cfg.rollout.episodes.env is None:
        if "max_turns" in explicit and not cfg.rollout.episodes.agentic:
            reject(cfg, "max_turns", "only applies to --env or --use-agentic-rollout episodes; "
                   "add one or remove it")
        if cfg.rollout.episodes.step_timeout is not None:
            reject(cfg, "env_step_timeout", "only applies to --env environments; add --env or "
                   "remove it (agent programs have --agent-timeout)")
        return
    if cfg.rollout.episodes.agentic:
        reject(cfg, ("env", "use_agentic_rollout"), "two episode sources; keep one")
    check_env_name(cfg)
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


def check_agents(cfg, explicit: set[str]) -> None:
    """``--use-agentic-rollout``: the command can start, and flags that only the trainer's own
    prompt formatting or reward would read are rejected (the agent writes the messages and
    reports the reward)."""
    if not cfg.rollout.episodes.agentic:
        for dest in ("agent_command", "agent_timeout"):
            if dest in explicit:
                reject(cfg, dest, "only applies to --use-agentic-rollout; add it or remove "
                       f"{flag_of(dest)}")
        return
    if cfg.rollout.episodes.agent_command is None:
        reject(cfg, "use_agentic_rollout", "needs --agent-command CMD, the agent program to "
               "run per episode")
    try:
        argv = shlex.split(cfg.rollout.episodes.agent_command)
    except ValueError as e:
        reject(cfg, "agent_command", f"cannot be split into arguments ({e}); check the quotes")
    program = argv[0] if argv else ""
    found = (os.path.isfile(program) and os.access(program, os.X_OK)) if os.sep in program \
        else shutil.which(program) is not None
    if not found:
        reject(cfg, "agent_command", f"{program!r} is not an executable file or a program on "
               "PATH; give a command that starts, e.g. 'python my_agent.py'")
    for dest in ("rm_type", "custom_rm_path", "apply_chat_template", "system_prompt",
                 "eval_interval", "fsdp"):
        if value_of(cfg, dest) not in (None, False):
            why = {"eval_interval": "evaluation runs on prompts, not agent episodes",
                   "fsdp": "sharded generation needs every rank to run the same number of "
                           "forward passes, and agents call at their own pace"}.get(
                dest, "the agent writes the messages and reports the reward")
            reject(cfg, ("use_agentic_rollout", dest), f"{why}; remove {flag_of(dest)}")
