"""The benchmarks' text tables: the first column (what was measured) left-aligned, the figures right-aligned, a rule
under the header row."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (the header first) as an aligned table on stdout."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def save(fig: dict, out: str) -> None:
    """Write ``fig`` (its every run included) to ``out`` as JSON."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fig, f, indent=1)


def emit(fig: dict, out: str, as_json: bool, table: Callable[[dict], None]) -> None:
    """Write ``fig`` (its every run included) to ``out`` as JSON, then print it: as JSON without its ``runs``
    (``as_json``), else as ``table`` prints it."""
    save(fig, out)
    if as_json:
        print(json.dumps({k: v for k, v in fig.items() if k != "runs"}, indent=1))
    else:
        table(fig)
