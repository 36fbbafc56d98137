"""How planning writes its figures: bytes, times, parameter and token counts, each in one fixed form so
every plan, search and piece of advice reads alike (no JAX).

    figures.gib(46 * 2**30)           # "46.0 GiB" (under 128 MiB: "34.0 MiB")
    figures.num(29.27)                # "29.3": three significant figures, no exponent
    figures.param_count(30.2e9)       # "30.2B" parameters
    figures.token_count(2.01e12)      # "2.01T" tokens
    figures.duration(1980)            # "33 min": seconds as s, min, h or days
"""

from __future__ import annotations


def gib(n: float) -> str:
    """Bytes: "46.0 GiB", or "34.0 MiB" below 128 MiB."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**27 else f"{n / 2**20:,.1f} MiB"


def num(x: float) -> str:
    """3 significant figures without an exponent: "0.6", "29.3", "478", "3,130"."""
    return f"{x:,.3g}" if x < 1000 else f"{float(f'{x:.3g}'):,.0f}"


def param_count(n: float) -> str:
    """A parameter count: "30.2B", "2.13M"."""
    return token_count(n) if n >= 1e9 or n < 1e6 else f"{n / 1e6:,.3g}M"


def token_count(n: float) -> str:
    """A token count: "2.01T", "101B", "4.78K"."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.3g}{unit}"
    return f"{n:,.0f}"


def duration(seconds: float) -> str:
    """Seconds in the unit that reads best: "0.22 s", "28 s", "33 min", "8.7 h", "2.1 days"."""
    for unit, size, below in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, 172800)):
        if seconds < below:
            return f"{num(seconds / size)} {unit}"
    return f"{num(seconds / 86400)} days"
