"""Plain words for what a user got wrong: pydantic's errors restated, and "did you mean"."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

# The patterns of phalanx.api.models, said in words.
_PATTERNS = {
    r"^[A-Za-z0-9_.@+-]+$": "only letters, digits and _ . @ + - are allowed",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "a variable name is letters, digits and _, not starting "
    "with a digit",
    r"^SIG[A-Z0-9]+$": "a signal name, e.g. SIGUSR1",
}
# Error types whose input is worth echoing ("got …"): short, and the thing at fault.
_ECHO = frozenset(
    {
        "less_than_equal",
        "greater_than_equal",
        "less_than",
        "greater_than",
        "string_pattern_mismatch",
        "int_type",
        "int_parsing",
        "bool_type",
        "string_type",
        "literal_error",
    }
)


def plain(error: Mapping[str, Any]) -> str:
    """One pydantic error (`ValidationError.errors()` item) as a short plain phrase: what
    is wrong and what is allowed, e.g. `too long: 5000 characters, at most 200`."""
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    value = error.get("input")
    message = str(error.get("msg", "invalid"))
    if kind == "string_too_long":
        size = f"{len(value)} characters, " if isinstance(value, str) else ""
        return f"too long: {size}at most {ctx.get('max_length')}"
    if kind == "string_too_short":
        least = ctx.get("min_length")
        return "must not be empty" if least == 1 else f"too short: at least {least} characters"
    if kind == "too_long":
        return f"too many: {ctx.get('actual_length')} items, at most {ctx.get('max_length')}"
    if kind == "too_short":
        return f"too few: at least {ctx.get('min_length')}"
    if kind == "less_than_equal":
        return f"too large: at most {ctx.get('le')}"
    if kind == "less_than":
        return f"too large: less than {ctx.get('lt')}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}"
    if kind == "greater_than":
        return f"must be more than {ctx.get('gt')}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return _PATTERNS.get(pattern, f"must match {pattern}")
    if kind in ("int_type", "int_parsing"):
        return "must be a whole number"
    if kind == "bool_type":
        return "must be true or false"
    if kind == "string_type":
        return "must be text"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    return message.replace("Input should be", "must be")


def echo(error: Mapping[str, Any]) -> str:
    """` (got VALUE)` when the input helps to see the mistake; '' when it does not (a
    5000-character name is better counted than shown)."""
    if error.get("type") not in _ECHO:
        return ""
    shown = repr(error.get("input"))
    return f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """` (did you mean X?)` for the closest of `choices` to a mistyped `word`, else ''.
    `prefix` (e.g. `--`) is shown, not compared: a shared `--` makes unrelated names look
    alike."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""
