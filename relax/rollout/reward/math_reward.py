"""``--rm-type math``: a 0/1 reward for a final mathematical answer.

The answer is the content of the LAST ``\\boxed{...}`` in the response (braces balanced), or
else the text after the last ``####`` (GSM8K style). A response with neither scores 0: the
format is part of what is rewarded. Labels may be a plain value (``72``, ``"3/4"``,
``"\\frac{3}{4}"``) or a raw GSM8K rationale ending in ``#### 72``.

Equality: exact string after light normalization, then numeric (fractions, thousands
separators, percent-free decimals, relative tolerance 1e-6), then symbolic with math-verify when
it is installed, under a per-sample time limit (math-verify's own alarm; only available in the
main thread, elsewhere it runs without a limit).
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

MATH_VERIFY_TIMEOUT_S = 5


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None  # unbalanced: the answer was cut off


def extract_answer(response: str) -> str | None:
    """The final answer of a response: last ``\\boxed{}``, else the text after the last ``####``."""
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    if "####" in response:
        tail = response.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    return None


def parse_label(label) -> str:
    """A label as an answer string: plain values, ``\\boxed{}`` labels, GSM8K ``#### 72`` tails."""
    if isinstance(label, bool) or label is None:
        raise ValueError(f"math label must be a number or a string, got {label!r}")
    if isinstance(label, (int, float)):
        return repr(label) if isinstance(label, float) else str(label)
    text = str(label)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = last_boxed(text)
    return (boxed if boxed is not None else text).strip()


_STRIP = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\displaystyle", "$"]


def normalize(ans: str) -> str:
    s = ans.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:d|t)?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    for tok in _STRIP:
        s = s.replace(tok, "")
    s = s.replace(" ", "").rstrip(".")
    # thousands separators: 1,000,000 -> 1000000 (only when every group has 3 digits)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def to_number(s: str) -> float | None:
    """A float for plain numbers and simple fractions ``a/b`` / ``(a)/(b)``, else None."""
    t = s.replace("(", "").replace(")", "")
    try:
        if "/" in t:
            num, den = t.split("/", 1)
            return float(Fraction(num) / Fraction(den))
        return float(Fraction(t))
    except (ValueError, ZeroDivisionError):
        return None


def _math_verify_equal(gold: str, answer: str) -> bool | None:
    """Symbolic equality by math-verify; None when it is not installed."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None
    main = threading.current_thread() is threading.main_thread()
    limit = MATH_VERIFY_TIMEOUT_S if main else None  # the alarm works in the main thread only
    try:
        g = parse(f"${gold}$", parsing_timeout=limit)
        a = parse(f"${answer}$", parsing_timeout=limit)
        return bool(g and a and verify(g, a, timeout_seconds=limit))
    except Exception:  # a parser failure on odd text is a wrong answer, not a crash
        return False


def answers_equal(gold: str, answer: str) -> bool:
    g, a = normalize(gold), normalize(answer)
    if g == a:
        return True
    gn, an = to_number(g), to_number(a)
    if gn is not None and an is not None:
        return math.isclose(gn, an, rel_tol=1e-6, abs_tol=1e-9)
    return bool(_math_verify_equal(gold, answer))


def math_reward(prompts: list[str], responses: list[str], labels: list) -> list[float]:
    """1.0 when the extracted final answer equals the label, else 0.0."""
    out = []
    for response, label in zip(responses, labels, strict=True):
        answer = extract_answer(response)
        out.append(1.0 if answer and answers_equal(parse_label(label), answer) else 0.0)
    return out
