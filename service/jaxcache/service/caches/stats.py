"""A cache's totals and statistics: entries, bytes, by function and compression, growth per day."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import BigInteger, Integer, cast, func, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.service.catalog.models import EntryRow


def _dialect(s: Session | Connection) -> str:
    return (s.dialect if isinstance(s, Connection) else s.get_bind().dialect).name


def day_of(dialect: str, seconds):
    """Whole days since 1970, rounded down (PostgreSQL's CAST rounds to nearest, hence FLOOR there)."""
    if dialect == "postgresql":
        return cast(func.floor(seconds / 86400), BigInteger)
    return cast(seconds / 86400, Integer)


def cache_totals(s: Session, cache: str) -> tuple[int, int]:
    """(entries, bytes) of a cache's ``-cache`` files."""
    count, size = s.execute(
        select(func.count(), func.coalesce(func.sum(EntryRow.size_bytes), 0))
        .where(EntryRow.cache == cache, EntryRow.kind == "entry")
    ).one()
    return int(count), int(size)


def stats(s: Session, cache: str) -> dict:
    """Totals, by function, by compression, growth per day, corrupt and orphan counts."""
    base = (EntryRow.cache == cache, EntryRow.kind == "entry")
    # One grouped pass over the table; totals, functions and compression are folded from it here.
    groups = s.execute(
        select(EntryRow.module, EntryRow.compression, EntryRow.status, func.count(), func.sum(EntryRow.size_bytes),
               func.coalesce(func.sum(EntryRow.compile_seconds), 0))
        .where(*base).group_by(EntryRow.module, EntryRow.compression, EntryRow.status)
    ).all()
    count = size = seconds = corrupt = 0
    compression: dict[str, int] = {}
    functions: dict[str, list[int]] = {}
    for module, comp, status, n, b, c in groups:
        n, b, c = int(n), int(b or 0), int(c or 0)
        count, size, seconds = count + n, size + b, seconds + c
        corrupt += n if status == "corrupt" else 0
        compression[comp or "unknown"] = compression.get(comp or "unknown", 0) + n
        f = functions.setdefault(module, [0, 0, 0])
        f[0], f[1], f[2] = f[0] + n, f[1] + b, f[2] + c
    by_fn = sorted(((m, f[0], f[1], f[2]) for m, f in functions.items()), key=lambda t: (-t[2], t[0]))
    orphans, orphan_bytes = s.execute(
        select(func.count(), func.coalesce(func.sum(EntryRow.size_bytes), 0))
        .where(EntryRow.cache == cache, EntryRow.kind == "orphan")
    ).one()
    now = time.time()
    day = day_of(_dialect(s), EntryRow.created_s)
    growth_rows = s.execute(
        select(day, func.count(), func.sum(EntryRow.size_bytes))
        .where(*base, EntryRow.created_s >= now - 30 * 86400).group_by(day).order_by(day)
    ).all()
    growth = [
        {"day": datetime.fromtimestamp(int(d) * 86400, UTC).date().isoformat(), "entries": int(n),
         "size_bytes": int(b)}
        for d, n, b in growth_rows
    ]
    week_start = int(now // 86400) - 6
    last_week = sum(int(b) for d, _, b in growth_rows if int(d) >= week_start)
    first = s.execute(select(func.min(EntryRow.created_s)).where(*base)).scalar()
    age_days = 0.0 if first is None else (now - float(first)) / 86400
    # A cache younger than a week is averaged over its own age, and not before its first whole day.
    per_day = (None if age_days < 1 else last_week / 7 if age_days >= 7
               else sum(int(b) for _, _, b in growth_rows) / age_days)
    return {
        "cache": cache,
        "entries": int(count), "size_bytes": int(size), "compile_seconds": int(seconds), "corrupt": int(corrupt),
        "orphans": int(orphans), "orphan_bytes": int(orphan_bytes),
        "compression": compression,
        "mixed_compression": compression.get("zstd", 0) > 0 and compression.get("zlib", 0) > 0,
        "by_function": [
            {"function": m, "entries": int(n), "size_bytes": int(b), "compile_seconds": int(c)}
            for m, n, b, c in by_fn[:100]
        ],
        "functions_total": len(by_fn),
        "growth": growth,
        "bytes_per_day": per_day,
        "first_created_s": None if first is None else float(first),
    }
