"""Token lifetimes on the command line: `90d`, `24h`, `30m`, `45s`, `2w`, bare seconds."""

from __future__ import annotations

import re

_TTL = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([smhdw]?)", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TTL_FORMS = "a number with s, m, h, d or w (e.g. 24h, 90d; a bare number is seconds)"


def parse_ttl(option: str, text: str, *, allow_never: bool = False) -> float:
    """Seconds in `text`; 0 for `never` where allowed. ValueError names the option."""
    raw = text.strip().lower()
    if allow_never and raw in ("never", "0"):
        return 0.0
    match = _TTL.fullmatch(raw)
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)] if match else 0.0
    if seconds <= 0:
        never = " or never" if allow_never else ""
        raise ValueError(f"{option} {text!r}: expected {TTL_FORMS}{never}")
    return seconds
