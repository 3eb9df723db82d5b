"""How the SDK and the CLI write numbers for people: one definition each, so a size or a loss reads
the same in every command (and as the web console writes it: `console/static/js/dom.js`)."""

from __future__ import annotations

import math

# Decimal units (1 MB = 1,000,000 bytes), as disks and networks count; the console's bytes() too.
SIZE_UNITS = ("kB", "MB", "GB", "TB")


def size_text(count: int) -> str:
    """2_048_000 -> '2.0 MB'; under 1 kB, whole bytes."""
    if count < 1000:
        return f"{count} B"
    value, unit = count / 1000, 0
    while round(value, 1) >= 1000 and unit < len(SIZE_UNITS) - 1:
        value, unit = value / 1000, unit + 1
    return f"{value:,.1f} {SIZE_UNITS[unit]}"


def number_text(value: float | None, digits: int = 4) -> str:
    """A loss, a norm or a learning rate to `digits` significant digits ('0.01234', '2e-05'); '-'
    for none. Training figures are means over noisy steps: more digits would be noise."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def duration_text(seconds: float) -> str:
    """75 -> '1m15s', 3_700 -> '1h01m'."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
