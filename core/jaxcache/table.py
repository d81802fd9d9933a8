"""Plain aligned text tables for terminal output."""

from __future__ import annotations

from collections.abc import Sequence

from jaxcache.display import shown


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: frozenset[int] = frozenset()) -> str:
    """Columns padded to their widest cell; column indexes in ``right`` are right-aligned (numbers). Cells are shown
    through :func:`jaxcache.display.shown`: a name from a root cannot disguise itself or rewrite the table."""
    rows = [[shown(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])
