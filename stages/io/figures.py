"""Figures for the reports (clean, evaluate, sweeps): matplotlib on its file-only Agg backend.

    fig, ax = figures.figure(width=6, height=3.5)          # ncols=2: (fig, (left, right))
    ax.plot(steps, losses)
    storage.write_bytes(path, figures.png(fig))            # PNG bytes; the figure is closed

No display is needed, so it is safe in Beam workers and CI. matplotlib is imported on first use: the
stages that never plot never pay for it.
"""

from __future__ import annotations

import io


def figure(width: float = 6, height: float = 3.5, ncols: int = 1):
    """(fig, ax), or (fig, axes) with ncols > 1, at 110 dpi."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height), dpi=110)


def png(fig) -> bytes:
    """The figure as PNG bytes (then closed, so long sweeps do not accumulate open figures)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
