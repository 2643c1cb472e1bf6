"""The generative judge's prompt template (``--genrm-prompt-template FILE``, else
:data:`DEFAULT_TEMPLATE`): which fields it may name, how a file is read and checked (validation)
and how it is filled (relax/rollout/reward/genrm.py), by the same parse. Torch-free."""

from __future__ import annotations

import string

# The judge's prompt. {label} is the data row's label (a reasoning-gym item's "answer").
DEFAULT_TEMPLATE = (
    "You are grading a student's answer to a question.\n\n"
    "Question:\n{prompt}\n\n"
    "Reference answer: {label}\n\n"
    "Student answer:\n{response}\n\n"
    "Does the student's final answer match the reference answer? Reply with one word: "
    "Yes or No.")
TEMPLATE_FIELDS = ("prompt", "response", "label")
MAX_TEMPLATE_BYTES = 1 << 16


def template_problem(text: str) -> str | None:
    """Why ``text`` cannot be a judging template, or None: it must name ``{response}``, may
    name ``{prompt}`` and ``{label}``, nothing else (``{{``/``}}`` are literal braces), and
    each field plainly: a format spec (``{response:>10000000}`` pads to ten million
    characters), a conversion (``{response!r}``) or a nested field would make the filled
    prompt something other than the text it names."""
    try:
        fields = list(_fields(text))
    except ValueError as e:
        return f"not a template ({e}); write literal braces as {{{{ and }}}}"
    for name, spec, conversion in fields:
        if name not in TEMPLATE_FIELDS:
            return (f"unknown field {{{name}}}; a template may use {{prompt}}, {{response}} "
                    "and {label}")
        if spec or conversion is not None:
            written = "{" + name + (f"!{conversion}" if conversion is not None else "") + \
                (f":{spec}" if spec else "") + "}"
            return (f"field {written} has a {'format spec' if spec else 'conversion'}; write "
                    f"{{{name}}} alone (the text is inserted as it is)")
    if not any(name == "response" for name, _, _ in fields):
        return "has no {response} field; the judge must see the response it judges"
    return None


def _fields(text: str):
    """``(name, format spec, conversion)`` of each replacement field, in order."""
    for _, name, spec, conversion in string.Formatter().parse(text):
        if name is not None:
            yield name, spec, conversion


def fill_template(template: str, *, prompt: str, response: str, label) -> str:
    """The template with each field replaced by its text: the same parse as
    :func:`template_problem`, so only what it accepted is ever filled (no ``str.format``)."""
    if isinstance(label, dict) and "answer" in label:  # a reasoning-gym item
        label = label["answer"]
    values = {"prompt": prompt, "response": response, "label": label}
    return "".join(literal + ("" if name is None else str(values[name]))
                   for literal, name, _, _ in string.Formatter().parse(template))


def read_template(path: str) -> str:
    """The template file's text (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_TEMPLATE_BYTES + 1)


def read_template_problem(path: str) -> str | None:
    try:
        text = read_template(path)
    except (OSError, UnicodeDecodeError) as e:
        return f"cannot read it ({type(e).__name__}: {' '.join(str(e).split())[:120]})"
    if len(text.encode("utf-8")) > MAX_TEMPLATE_BYTES:
        return f"larger than {MAX_TEMPLATE_BYTES} bytes; a judging prompt is a few lines"
    return template_problem(text)
