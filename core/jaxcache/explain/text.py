"""Explained misses as text for a terminal, as git and cargo print explanations: one block per cause and function,
a heading line, then what differs (each change on its own lines) and the fix, wrapped to the terminal's width.
``jaxcache explain`` and ``warmup --check`` print them alike."""

from __future__ import annotations

import shutil
import textwrap
from collections import defaultdict
from typing import Any

from jaxcache.display import shown
from jaxcache.units import plural

#: The text's width: the terminal's, at most 100 columns (and at least 60 where it is narrower).
MAX_WIDTH, MIN_WIDTH = 100, 60
_LABEL = "  "


def width() -> int:
    """The width to wrap to here."""
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def blocks(rows: list[dict[str, Any]], columns: int | None = None) -> str:
    """The misses (``Explanation.as_dict()`` with ``function`` and ``compile_s``), grouped by cause and function,
    the most compile seconds first, blocks apart by a blank line."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["cause"], r["function"])].append(r)
    ordered = sorted(groups.items(), key=lambda g: -sum(r.get("compile_s") or 0 for r in g[1]))
    columns = columns or width()
    return "\n\n".join(_block(cause, function, g, columns) for (cause, function), g in ordered)


def _block(cause: str, function: str, misses: list[dict[str, Any]], columns: int) -> str:
    """One cause of one function's misses. The fix names the changes already listed above it by reference, not
    again."""
    first = misses[0]
    timed = [r["compile_s"] for r in misses if r.get("compile_s") is not None]  # none: not measured (--verify's)
    lines = [f"{shown(cause)}: {shown(function)}, {plural(len(misses), 'miss')}"
             + (f", {sum(timed):.1f} compile seconds" if timed else "")]
    fix = first["fix"] or ""
    for d in first["differs"]:
        said = list(d["changes"]) or ([f"{d['theirs'] or '?'} → {d['mine'] or '?'}"] if d["mine"] or d["theirs"]
                                      else [])
        lines += _wrapped(f"{d['part']} differs" + (":" if said else ""), columns, _LABEL)
        for change in said:
            lines += _wrapped(change, columns, _LABEL + "  ", "- ")
        if said:
            fix = fix.replace("; ".join(said), "the changes above" if d["changes"] else "as above")
    if first["nearest"]:
        lines += _wrapped(f"nearest key: {first['nearest']}", columns, _LABEL)
    lines += _wrapped(fix, columns, _LABEL, "fix: ")
    return "\n".join(lines)


def _wrapped(text: str, columns: int, indent: str, bullet: str = "") -> list[str]:
    """``text`` in lines of at most ``columns``, the first after ``bullet``, the rest under its text."""
    return textwrap.wrap(shown(text), columns, initial_indent=indent + bullet,
                         subsequent_indent=indent + " " * len(bullet), break_on_hyphens=False)
