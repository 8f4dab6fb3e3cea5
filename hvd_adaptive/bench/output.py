"""How benchmarks and reports write what they found: aligned text tables and PNG figures, and
the error a report's input raises."""
from __future__ import annotations

from pathlib import Path


class ReportError(ValueError):
    """A report's input (its arguments, a scaling.json) cannot be used; the message names it."""


def align(cells: list[list[str]], text_columns: int) -> str:
    """Rows of cells as lines, each column as wide as its widest cell.

    The first `text_columns` columns read left-aligned (names), the others right-aligned
    (numbers); columns are two spaces apart.
    """
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < text_columns else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths))).rstrip()
                      for line in cells)


def save_png(fig, out: str | Path) -> Path:
    """Writes a matplotlib figure to `out` (PNG, its folder created) and closes it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out
