"""`parse_duration`: seconds from a flag value such as "3600", "90s", "30m", "12h" or "7d"."""

from __future__ import annotations

import argparse
import re

_UNITS_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """Seconds from a number with an optional unit (s, m, h, d, w; none = seconds); raises
    argparse.ArgumentTypeError for anything else or a value that is not positive."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdw]?)\s*", text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 3600, 90s, 30m, 12h, 7d)")
    seconds = float(match.group(1)) * _UNITS_S[match.group(2)]
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive: {text!r}")
    return seconds
