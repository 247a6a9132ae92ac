"""Formatting of stats values for the dashboard: durations, sizes, rates, and `n/a` for
anything the server could not report. Pure functions, no Textual."""

from __future__ import annotations

import time

NA = "n/a"


def num(value: object) -> float | None:
    """A finite number, or None for anything else (missing, null, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None  # NaN is not a reading


def seconds(value: object) -> str:
    """A latency in at most six characters: 850us, 12.3ms, 123ms, 1.23s, 12.3s, 4m05s."""
    s = num(value)
    if s is None:
        return NA
    if s < 0.001:
        return f"{s * 1e6:.0f}us"
    if s < 0.1:
        return f"{s * 1e3:.1f}ms"
    if s < 1:
        return f"{s * 1e3:.0f}ms"
    if s < 10:
        return f"{s:.2f}s"
    if s < 100:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def uptime(value: object) -> str:
    """Uptime as 3d04h, 1h02m03s, 4m05s or 12s."""
    s = num(value)
    if s is None:
        return NA
    s = int(s)
    days, rest = divmod(s, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def gib(value: object) -> str:
    b = num(value)
    return NA if b is None else f"{b / 2**30:.1f} GiB"


def rate(value: object) -> str:
    """Tokens per second: 12.3, 1234, 12.3k."""
    r = num(value)
    if r is None:
        return NA
    if r >= 10_000:
        return f"{r / 1000:.1f}k"
    return f"{r:.0f}" if r >= 100 else f"{r:.1f}"


def unit(value: object, suffix: str, digits: int = 0) -> str:
    """`value` with a unit (45%, 250 W), or n/a."""
    v = num(value)
    return NA if v is None else f"{v:.{digits}f}{suffix}"


def params(value: object) -> str:
    """A parameter count in three significant digits: 135M, 3.35B, 30.5B."""
    v = num(value)
    if v is None:
        return NA
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            n = v / scale
            return f"{n:.3g}{suffix}"
    return f"{v:.0f}"


def integer(value: object) -> str:
    v = num(value)
    return NA if v is None else str(int(v))


def clock(t: float) -> str:
    """Wall-clock time of day, local time: 14:03:07."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def gauge(fraction: float, width: int) -> str:
    """A text bar readable without colour: `#####.....` drawn with full and light blocks."""
    width = max(1, width)
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def short_id(request_id: str, width: int) -> str:
    return request_id if len(request_id) <= width else request_id[: width - 1] + "…"


def count(value: object) -> str:
    """A token or request count in at most six characters: 987, 12.3k, 480k, 1.23M."""
    v = num(value)
    if v is None:
        return NA
    if v < 10_000:
        return str(int(v))
    if v < 1_000_000:
        return f"{v / 1000:.1f}k" if v < 100_000 else f"{v / 1000:.0f}k"
    return f"{v / 1e6:.2f}M"


def bandwidth(gbs: object) -> str:
    """Memory bandwidth: 950 GB/s, 3.94 TB/s."""
    v = num(gbs)
    if v is None:
        return NA
    return f"{v / 1000:.2f} TB/s" if v >= 1000 else f"{v:.0f} GB/s" if v >= 10 else f"{v:.1f} GB/s"
