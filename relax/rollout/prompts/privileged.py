"""The teacher's prompt of on-policy self-distillation (``--opd-type self``,
reinforce_plus_plus.md §7b "Self mode"): the row's prompt with its privileged information
(``--opsd-privileged-info-key``, the reference solution) added by one fixed template, then
formatted exactly as the student's prompt is (``--apply-chat-template``, ``--system-prompt``).

Where the block goes: after the problem, inside the user's turn, so the chat template still
puts the assistant header last and the teacher scores the student's response as the
assistant's answer. A string prompt becomes ``TEMPLATE.format(prompt=..., privileged=...)``;
in a message list the block is appended to the last user message (the last message when none
is a user's). Torch-free.
"""

from __future__ import annotations

from dataclasses import replace

TEMPLATE = ("{prompt}\n\nHere is a reference solution:\n{privileged}\n\nAfter reading the "
            "reference solution, solve the problem above in your own words.")


def with_privileged(prompt, privileged: str):
    """``prompt`` (a string or a list of ``{"role", "content"}`` messages) with the block of
    :data:`TEMPLATE`; the input is not modified."""
    if isinstance(prompt, str):
        return TEMPLATE.format(prompt=prompt, privileged=privileged)
    messages = [dict(m) for m in prompt]
    users = [i for i, m in enumerate(messages) if m.get("role", "user") == "user"]
    last = users[-1] if users else len(messages) - 1
    messages[last]["content"] = TEMPLATE.format(prompt=messages[last]["content"],
                                                privileged=privileged)
    return messages


def teacher_samples(samples) -> list:
    """``samples`` (PromptSample, with ``privileged``) as the teacher reads them: for the
    context-length check, whose errors then name the same ``file:line``."""
    return [replace(s, prompt=with_privileged(s.prompt, s.privileged)) for s in samples]
