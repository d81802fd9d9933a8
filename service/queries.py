"""Catalog queries behind the REST routes: filtered, sorted, keyset-paginated listings and statistics."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from jaxcache.errors import InvalidInputError
from jaxcache.service.catalog import EntryRow
from sqlalchemy import Integer, Row, and_, cast, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

SORTS = {
    "size": EntryRow.size_bytes,
    "compile": func.coalesce(EntryRow.compile_seconds, -1),
    "last_used": EntryRow.last_used_s,
    "created": EntryRow.created_s,
    "name": EntryRow.key,
}


#: The fields of one entry in a listing page, in the order :func:`list_entries` selects them.
PAGE_FIELDS = ("key", "function", "size_bytes", "created_s", "last_used_s", "has_atime", "compression",
               "compile_seconds", "status", "reason", "generation")
_PAGE_COLUMNS = (
    EntryRow.key, EntryRow.module.label("function"), EntryRow.size_bytes, EntryRow.created_s, EntryRow.last_used_s,
    EntryRow.has_atime, EntryRow.compression, EntryRow.compile_seconds, EntryRow.status, EntryRow.reason,
    EntryRow.generation,
)


@dataclass(frozen=True, slots=True)
class EntryFilter:
    function: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    unused_for_s: float | None = None
    older_than_s: float | None = None
    status: str | None = None


def glob_to_like(glob: str) -> str:
    """fnmatch-style ``*`` and ``?`` as SQL LIKE (escape ``\\``), portable across SQLite and PostgreSQL."""
    if "[" in glob:
        raise InvalidInputError("function globs support * and ? only")
    out = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return out.replace("*", "%").replace("?", "_")


def _literal_prefix(glob: str) -> str:
    """The part of a glob before its first wildcard."""
    for i, ch in enumerate(glob):
        if ch in "*?[":
            return glob[:i]
    return glob


def _encode_cursor(value, key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([value, key]).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[object, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, key = json.loads(raw)
        if not isinstance(key, str) or not isinstance(value, int | float | str):
            raise ValueError
        return value, key
    except (ValueError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidInputError("cursor is not one this service issued: start again without it") from None


def list_entries(
    s: Session | Connection, cache: str, flt: EntryFilter, *, sort: str, order: str, limit: int, cursor: str | None,
) -> tuple[list[Row], str | None]:
    """One page of entries and the cursor of the next page (None on the last page)."""
    col = SORTS[sort]
    now = time.time()
    # Plain rows of exactly the API's fields, in PAGE_FIELDS order: a page is read-only and this is the hottest query.
    q = select(*_PAGE_COLUMNS).where(EntryRow.cache == cache, EntryRow.kind == "entry")
    if flt.function:
        q = q.where(EntryRow.module.like(glob_to_like(flt.function), escape="\\"))
        prefix = _literal_prefix(flt.function)
        if prefix:
            # LIKE cannot use an index portably (SQLite's is case-insensitive); a range on the literal prefix can.
            q = q.where(EntryRow.module >= prefix, EntryRow.module < prefix[:-1] + chr(ord(prefix[-1]) + 1))
    if flt.min_size is not None:
        q = q.where(EntryRow.size_bytes >= flt.min_size)
    if flt.max_size is not None:
        q = q.where(EntryRow.size_bytes <= flt.max_size)
    if flt.unused_for_s is not None:
        q = q.where(EntryRow.last_used_s < now - flt.unused_for_s)
    if flt.older_than_s is not None:
        q = q.where(EntryRow.created_s < now - flt.older_than_s)
    if flt.status:
        q = q.where(EntryRow.status == flt.status)
    desc = order == "desc"
    if cursor:
        value, key = _decode_cursor(cursor)
        if sort == "name":
            q = q.where(EntryRow.key < key if desc else EntryRow.key > key)
        elif desc:
            q = q.where(or_(col < value, and_(col == value, EntryRow.key < key)))
        else:
            q = q.where(or_(col > value, and_(col == value, EntryRow.key > key)))
    if sort == "name":
        q = q.order_by(EntryRow.key.desc() if desc else EntryRow.key)
    else:
        q = q.order_by(col.desc() if desc else col, EntryRow.key.desc() if desc else EntryRow.key)
    rows = s.execute(q.limit(limit + 1)).all()
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    value = {
        "size": last.size_bytes,
        "compile": -1 if last.compile_seconds is None else last.compile_seconds,
        "last_used": last.last_used_s,
        "created": last.created_s,
        "name": last.key,
    }[sort]
    return rows, _encode_cursor(value, last.key)


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
    by_fn = sorted(((m, *v) for m, v in functions.items()), key=lambda t: (-t[2], t[0]))
    orphans, orphan_bytes = s.execute(
        select(func.count(), func.coalesce(func.sum(EntryRow.size_bytes), 0))
        .where(EntryRow.cache == cache, EntryRow.kind == "orphan")
    ).one()
    now = time.time()
    day = cast(EntryRow.created_s / 86400, Integer)  # truncation is floor for times after 1970
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
        "bytes_per_day": last_week / 7,
    }
