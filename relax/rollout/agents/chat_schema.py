"""What the agent endpoint accepts (relax/rollout/agents/agent_server.py): a Chat Completions request
body, checked in the handler thread before anything reaches the tokenizer or the trainer's
main thread.

:func:`parse_request` reads the body bytes and returns ``(body, None)`` with the messages
normalized (a list of text content parts becomes one string), or ``(None, reason)`` for the
400 answer. Checked: JSON that parses (nesting too deep is refused, not a RecursionError), an
object with a non-empty ``messages`` list of objects with a known ``role`` and text
``content`` (a string, text parts, or null for an assistant message), valid UTF-8 text (a
JSON ``\\ud800`` escape would make the tokenizer raise), ``tools`` as a list of functions,
``max_tokens`` a positive integer, ``n`` 1 and no streaming. The size of the body is bounded
before it is read (``MAX_BODY_BYTES``, a 413).
"""

from __future__ import annotations

import json

from relax.errors import invalid_text

MAX_BODY_BYTES = 8 << 20  # the cap of a data line too: far above any conversation of a context
ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_request(raw: bytes) -> tuple[dict | None, str | None]:
    """``(body, None)`` or ``(None, why it is refused)``."""
    try:
        body = json.loads(raw)
    except RecursionError:
        return None, "the JSON is nested too deeply"
    except ValueError as e:
        return None, f"not valid JSON ({' '.join(str(e).split())[:100]})"
    if not isinstance(body, dict):
        return None, f"expected a JSON object, got {type(body).__name__}"
    why = _options_problem(body) or _messages_problem(body.get("messages"))
    return (None, why) if why else (body, None)


def _options_problem(body: dict) -> str | None:
    # one recorded continuation per call: several choices or a stream would need a sample
    # per choice and chunked replies, which the recording does not make
    if body.get("stream"):
        return "stream=true is not supported; call without streaming"
    if body.get("n", 1) != 1:
        return "n must be 1 (one recorded continuation per call)"
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            return f"{key} must be a positive integer, got {_kind(value)}"
    if not isinstance(body.get("model", ""), str):
        return f"model must be a string, got {_kind(body['model'])}"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return f"tools must be a list, got {_kind(tools)}"
        for k, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                return (f"tools[{k}] must be {{\"type\": \"function\", \"function\": "
                        "{\"name\": ...}}")
    return None


def _messages_problem(messages) -> str | None:
    if not isinstance(messages, list) or not messages:
        return f"messages must be a non-empty list of message objects, got {_kind(messages)}"
    for k, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages[{k}] must be an object with role and content, got {_kind(message)}"
        role = message.get("role")
        if role not in ROLES:
            return f"messages[{k}].role must be one of {', '.join(ROLES)}, got {_kind(role)}"
        content, why = _text_content(message.get("content"), role)
        if why:
            return f"messages[{k}].content {why}"
        message["content"] = content
        if not isinstance(message.get("tool_calls") or [], list):
            return f"messages[{k}].tool_calls must be a list"
    return None


def _text_content(content, role: str) -> tuple[str | None, str | None]:
    """The content as one string (None stays None for an assistant), or why it is refused."""
    if content is None:
        return (None, None) if role == "assistant" else (None, "must be text, got null")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                return None, ("parts must be text parts {\"type\": \"text\", \"text\": ...}, "
                              f"got {kind!r}")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        return None, f"must be text, got {_kind(content)}"
    bad = invalid_text(content)
    return (None, f"is {bad}") if bad else (content, None)


def _kind(value) -> str:
    text = json.dumps(value)[:40] if not isinstance(value, (dict, list)) else ""
    return f"{type(value).__name__}{' ' + text if text else ''}"
