"""The benchmarks' text tables: the first column (what was measured) left-aligned, the figures right-aligned, a rule
under the header row."""

from __future__ import annotations

from collections.abc import Sequence


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (the header first) as an aligned table on stdout."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
