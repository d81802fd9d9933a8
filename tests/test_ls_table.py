"""The `jaxcache ls` table and its kept part: laid out as the table renderer lays out its cells, the fixed cells given
again while the root lists the same, the ages always those of the time of asking."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jaxcache.cli import ls_table, main
from jaxcache.scan import Entry, scan
from jaxcache.storage import open_storage
from jaxcache.table import render
from jaxcache.units import format_bytes, format_duration, plural


def out_of(capsys, *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def entries_of(root: Path) -> list[Entry]:
    return sorted((r for r in scan(open_storage(str(root))) if isinstance(r, Entry)), key=lambda e: e.key)


def rendered(entries: list[Entry], now: float, heads: bool, url: str) -> str:
    """The table as `ls` printed it before its cells were kept: every cell formatted, then rendered."""
    unread = "?" if heads else "-"
    rows = [[e.module, e.hash[:12], format_bytes(e.size_bytes),
             unread if e.compile_seconds is None else f"{e.compile_seconds} s", format_duration(now - e.mtime_s),
             format_duration(now - e.last_used_s) if e.atime_ns is not None else "-",
             e.compression.value if e.compression else unread, e.status.value if e.status else unread]
            for e in entries]
    lines = [render(ls_table.HEADERS, rows, right=frozenset({2, 3, 4, 5})), *([ls_table.USED_NOTE] if rows else []),
             f"{plural(len(rows), 'entry')}, {format_bytes(sum(e.size_bytes for e in entries))} in {url}"]
    if not heads:
        lines.append("heads not read (a request per entry in an object store): --heads shows compile seconds, "
                     "compression and status (each object's head read once: the head index keeps it)")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("heads", [True, False])
def test_the_table_is_laid_out_as_the_renderer_lays_out_its_cells(cache_copy, jax_caches, heads):
    victim = jax_caches["zstd"].entries[0]["key"]
    (cache_copy / f"{victim}-atime").unlink()  # one entry never used: "-"
    entries = entries_of(cache_copy)
    assert any(e.atime_ns is None for e in entries) and any(e.atime_ns is not None for e in entries)
    table = ls_table.decode(ls_table.build(entries, heads=heads, url="ROOT").encode())
    assert table is not None
    now = time.time()
    for at in (now, now + 59, now + 3 * 3600 + 7, now + 40 * 86400):  # ages of every width
        assert table.render(at).decode() == rendered(entries, at, heads, "ROOT")
    empty = ls_table.build([], heads=heads, url="ROOT")
    assert empty.render(now).decode() == rendered([], now, heads, "ROOT")


def test_a_second_table_prints_the_kept_cells_with_ages_of_now(capsys, cache_copy, jax_caches, index_dir):
    root = str(cache_copy)
    first = out_of(capsys, "ls", root)
    (kept,) = index_dir.glob("*.ls-table")
    data = kept.read_bytes()
    assert b"jit_odd-name.v2" in data
    kept.write_bytes(data.replace(b"jit_odd-name.v2", b"jit_ODD-name.v2"))  # the same length, as its header says
    second = out_of(capsys, "ls", root)
    assert "jit_ODD-name.v2" in second and "jit_odd-name.v2" not in second  # the kept cells, not rebuilt
    assert len(second.splitlines()) == len(first.splitlines())

    (cache_copy / ("jit_gone-" + "0" * 64 + "-atime")).write_bytes(b"\0" * 8)  # the root changed: afresh
    third = out_of(capsys, "ls", root)
    assert "jit_odd-name.v2" in third and "jit_ODD-name.v2" not in third
    assert b"jit_odd-name.v2" in kept.read_bytes()


def test_the_kept_ages_move_with_the_clock(cache_copy):
    entries = entries_of(cache_copy)
    table = ls_table.build(entries, heads=True, url="ROOT")
    now = time.time()
    assert table.render(now) != table.render(now + 2 * 86400)
    assert f"{format_duration(now + 2 * 86400 - entries[0].mtime_s)}" in table.render(now + 2 * 86400).decode()


def test_a_kept_table_of_another_layout_is_rebuilt_silently(capsys, cache_copy, index_dir):
    root = str(cache_copy)
    first = out_of(capsys, "ls", root)
    (kept,) = index_dir.glob("*.ls-table")
    data = kept.read_bytes()
    length_end = data.index(b"\n") + 1  # one header line (ending with the payload's length), then the payload
    kept.write_bytes(data[:length_end] + b"\xc1" * (len(data) - length_end))  # a byte msgpack never uses
    again = out_of(capsys, "ls", root)
    assert capsys.readouterr().err == ""
    assert [line.split()[:2] for line in again.splitlines()] == [line.split()[:2] for line in first.splitlines()]
    assert ls_table.decode(kept.read_bytes()[length_end:]) is not None


def two_largest_units(seconds: float) -> str:
    """What an age shows, spelled as its definition: the two largest units that are not zero."""
    s, parts = int(max(seconds, 0)), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size or (unit == "s" and not parts):
            parts.append(f"{s // size}{unit}")
            s %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def test_ages_show_the_two_largest_units_that_are_not_zero():
    edges = [k * size + j for size in (60, 3600, 86400) for k in range(1, 4) for j in (-1, 0, 1, 59, 60, 61, 3600)]
    for seconds in [*range(0, 7300), *range(86_000, 90_000), *edges, -5, 0.5, 59.9, 3600.2, 10**9 + 7]:
        assert format_duration(seconds) == two_largest_units(seconds), seconds
    assert format_duration(90061) == "1d 1h" and format_duration(86460) == "1d 1m" and format_duration(3605) == "1h 5s"


def test_every_age_in_a_column_is_its_own_formatted_age():
    """One text per minute or hour past an hour: an age whose second unit is zero ("5h 12s") is not its neighbours'."""
    now = 1_800_000_000.25
    ages = [*range(0, 4000), *range(86_000, 90_000), *(k * 3600 + j for k in (1, 5, 23, 24, 25, 49)
                                                         for j in (-61, -60, -1, 0, 1, 59, 60, 61, 119, 3599))]
    ages += [10**7 + 3601 * i for i in range(2000)]
    created = [now - a - 0.5 for a in ages]
    used: list[float | None] = [None if i % 7 == 0 else now - a for i, a in enumerate(reversed(ages))]
    n = len(ages)
    table = ls_table.LsTable(head_before="", head_after="END", before=[""] * n, after=["x"] * n, created_s=created,
                             used_s=used, footer="")
    lines = table.render(now).decode().splitlines()
    assert lines[0].split() == ["AGE", "LAST", "USED", "END"]
    for line, c, u in zip(lines[1:-1], created, used, strict=True):
        cells = line.split("  ")
        shown = [cell.strip() for cell in cells if cell.strip()]
        assert shown == [format_duration(now - c), "-" if u is None else format_duration(now - u), "x"]
