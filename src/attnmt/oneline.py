"""Output that stays one line for every reader: text with its line breaks folded, and strict JSON records.

A translation, a subword or an error message can hold a line break that is not ``\\n`` (CR,
U+0085, U+2028, U+2029: Python's ``str.splitlines`` knows them all), and a model with NaN
weights gives scores that JSON has no number for (RFC 8259, section 6). :func:`one_line` and
:func:`json_line` keep a line-per-record output (``attnmt translate``, ``attnmt score``, the
command line's messages) one line per record, and :func:`finite_or_none` keeps JSON strict
(the training log too).

Library: json (standard library).
"""

from __future__ import annotations

import json
import math


def one_line(text: str) -> str:
    """``text`` with every line break Python knows (CR, U+2028, ...) replaced by a space, so an
    output line stays one line for every reader."""
    return " ".join(text.splitlines())


def finite_or_none(value):
    """``value`` with every float that is not finite replaced by None (in lists and dicts too)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def json_line(obj) -> str:
    """Strict JSON on one line: numbers that are not finite (a NaN model's scores) become null;
    the line breaks JSON leaves raw (U+0085, U+2028, U+2029) are escaped, so a record is one
    line for every reader; other characters are written as they are (UTF-8, not ``\\u``
    escapes)."""
    text = json.dumps(finite_or_none(obj), ensure_ascii=False, allow_nan=False)
    return text.replace("\x85", "\\u0085").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
