"""Entry listings: filtered, sorted, keyset-paginated pages (the hottest query), and one entry's detail."""

from __future__ import annotations

import base64
import functools
import json
import re
import time
from dataclasses import dataclass

from sqlalchemy import BindParameter, Row, bindparam, func, literal_column, or_, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from jaxcache.errors import InvalidInputError
from jaxcache.records import JOB
from jaxcache.service.catalog import attestations
from jaxcache.service.catalog.models import EntryRow, UsageRow, VerificationRow
from jaxcache.storage import generation_of

# "compile" is literally the indexed expression (catalog.COMPILE_SORT_SQL): a bound -1 would not match the index.
SORTS = {"size": EntryRow.size_bytes, "compile": func.coalesce(EntryRow.compile_seconds, literal_column("-1")),
         "last_used": EntryRow.last_used_s, "created": EntryRow.created_s, "name": EntryRow.key, "hits": EntryRow.hits}

#: A listing row's fields in select order; WRITER_FIELDS follow, nested as ``first_writer`` by :func:`page_entry`.
PAGE_FIELDS = ("key", "function", "size_bytes", "created_s", "last_used_s", "has_atime", "compression",
               "compile_seconds", "status", "reason", "version", "hits", "last_hit_s", "measured_compile_s",
               "saved_s", "platform_compile_s", "platform_machine")
WRITER_FIELDS = ("job", "run_id", "process_index", "host", "topology", "jax", "jaxlib", "at_s", "machine")
_PAGE_COLUMNS = (
    EntryRow.key, EntryRow.module.label("function"), EntryRow.size_bytes, EntryRow.created_s, EntryRow.last_used_s,
    EntryRow.has_atime, EntryRow.compression, EntryRow.compile_seconds, EntryRow.status, EntryRow.reason,
    EntryRow.version, EntryRow.hits, EntryRow.last_hit_s, EntryRow.writer_compile_s, EntryRow.saved_s,
    EntryRow.platform_compile_s, EntryRow.platform_machine,
    EntryRow.writer_job, EntryRow.writer_run, EntryRow.writer_process, EntryRow.writer_host,
    EntryRow.writer_topology, EntryRow.writer_jax, EntryRow.writer_jaxlib, EntryRow.writer_at_s,
    EntryRow.writer_machine,
)
_N = len(PAGE_FIELDS)


def page_entry(row: Row | tuple, root: str) -> dict:
    """One listed entry of the cache at ``root`` as the API's JSON object (the fields of ``EntryModel``)."""
    out = dict(zip(PAGE_FIELDS, row[:_N], strict=True))
    out["has_atime"] = bool(out["has_atime"])  # SQLite's raw rows give 0/1
    out["generation"] = generation_of(root, out["version"])  # the integer clients of GCS roots read before versions
    out["first_writer"] = None if row[_N] is None else dict(zip(WRITER_FIELDS, row[_N:], strict=True))
    # What each hit is credited with (jaxcache.usage_rules.credited_measure): the platform's measure, else the
    # writer's, else JAX's stored whole seconds.
    out["saved_basis"] = ("platform" if out["platform_compile_s"] is not None
                          else "writer" if out["measured_compile_s"] is not None else "stored")
    return out


@dataclass(frozen=True, slots=True)
class EntryFilter:
    function: str | None = None
    min_size: int | None = None
    max_size: int | None = None
    unused_for_s: float | None = None
    older_than_s: float | None = None
    status: str | None = None
    job: str | None = None  # entries the job wrote or hit
    jaxlib: str | None = None  # the first writer's
    topology: str | None = None  # the first writer's


def glob_pattern(dialect: str, glob: str) -> str:
    """What :func:`glob_match` compares with: the glob on SQLite, its LIKE form (escape ``\\``) on PostgreSQL."""
    if "[" in glob:
        raise InvalidInputError("function globs support * and ? only")
    if dialect == "sqlite":
        return glob
    return glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").replace("*", "%").replace("?", "_")


def glob_match(dialect: str, column, pattern):
    """``column`` matches ``pattern`` case-sensitively, as the CLI does: GLOB on SQLite, LIKE on PostgreSQL."""
    if dialect == "sqlite":
        return column.op("GLOB", is_comparison=True)(pattern)
    return column.like(pattern, escape="\\")


def encode_cursor(value, key: str) -> str:
    """The opaque cursor of a page that ends at (``value``, ``key``): what :func:`decode_cursor` reads back."""
    return base64.urlsafe_b64encode(json.dumps([value, key]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int | float | str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, key = json.loads(raw)
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError
        return value, key
    except (ValueError, TypeError, json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidInputError("cursor is not one this service issued: start again without it") from None


def list_entries(
    conn: Connection, cache: str, flt: EntryFilter, *, sort: str, order: str, limit: int, cursor: str | None,
) -> tuple[list[tuple], str | None]:
    """One page of entries (tuples in :data:`PAGE_FIELDS` order) and the next page's cursor (None on the last)."""
    now = time.time()
    params: dict[str, object] = {"cache": cache, "page_limit": limit + 1}
    filters: list[str] = []
    if flt.function:
        params["fn_pattern"] = glob_pattern(conn.dialect.name, flt.function)
        filters.append("function")
        prefix = re.split(r"[*?[]", flt.function, maxsplit=1)[0]
        if prefix and prefix[-1] != chr(0x10FFFF):  # (the last code point has no successor)
            params["fn_lo"], params["fn_hi"] = prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
            filters.append("prefix")
    for name, value in (("min_size", flt.min_size), ("max_size", flt.max_size), ("status", flt.status or None),
                        ("jaxlib", flt.jaxlib), ("topology", flt.topology), ("job", flt.job),
                        ("used_before", None if flt.unused_for_s is None else now - flt.unused_for_s),
                        ("created_before", None if flt.older_than_s is None else now - flt.older_than_s)):
        if value is not None:
            params[name] = value
            filters.append(name)
    if cursor:
        after, key = decode_cursor(cursor)
        # PostgreSQL refuses to compare a number column with text: a wrong-kind cursor is not one we issued.
        if (sort == "name") != isinstance(after, str) or abs(0 if isinstance(after, str) else after) > 2**62:
            raise InvalidInputError("cursor is not one this service issued for this sort: start again without it")
        params["after_key"] = key
        if sort != "name":
            params["after_value"] = after
    statement = _page_statement(conn.dialect.name, sort, order == "desc", bool(cursor), tuple(filters))
    rows: list[tuple] = [tuple(r) for r in conn.execute(statement, params)]
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    value = rows[-1][_SORT_INDEX[sort]]
    return rows, encode_cursor(-1 if sort == "compile" and value is None else value, rows[-1][0])


_SORT_INDEX = {sort: PAGE_FIELDS.index(field) for sort, field in (
    ("size", "size_bytes"), ("compile", "compile_seconds"), ("last_used", "last_used_s"), ("created", "created_s"),
    ("name", "key"), ("hits", "hits"))}


#: Filters that compare one column with their bound parameter of the same name.
_COMPARED = {
    "min_size": lambda v: EntryRow.size_bytes >= v, "max_size": lambda v: EntryRow.size_bytes <= v,
    "used_before": lambda v: EntryRow.last_used_s < v, "created_before": lambda v: EntryRow.created_s < v,
    "status": lambda v: EntryRow.status == v, "jaxlib": lambda v: EntryRow.writer_jaxlib == v,
    "topology": lambda v: EntryRow.writer_topology == v,
}


@functools.cache
def _page_statement(dialect: str, sort: str, desc: bool, has_cursor: bool, filters: tuple[str, ...]):
    """The listing query of one shape, every value bound, so it is built and compiled once."""
    col = SORTS[sort]
    q = select(*_PAGE_COLUMNS).where(EntryRow.cache == bindparam("cache"), EntryRow.kind == "entry")
    if "function" in filters:
        q = q.where(glob_match(dialect, EntryRow.module, bindparam("fn_pattern")))
    if "prefix" in filters:
        # A prefix range uses the module's and key's indexes where a pattern cannot (code-point order: schema.Str).
        lo: BindParameter[str] = bindparam("fn_lo")
        hi: BindParameter[str] = bindparam("fn_hi")
        q = q.where(EntryRow.module >= lo, EntryRow.module < hi, EntryRow.key >= lo, EntryRow.key < hi)
    for name in filters:
        if name in _COMPARED:
            q = q.where(_COMPARED[name](bindparam(name)))
    if "job" in filters:
        used = select(UsageRow.key).where(UsageRow.cache == bindparam("cache"), UsageRow.job == bindparam("job"),
                                          UsageRow.kind == JOB, or_(UsageRow.hits > 0, UsageRow.writes > 0))
        q = q.where(EntryRow.key.in_(used))
    if has_cursor:
        key: BindParameter[str] = bindparam("after_key")
        if sort == "name":
            q = q.where(EntryRow.key < key if desc else EntryRow.key > key)
        else:
            # A row-value comparison is always planned as an index range; the equivalent OR is not.
            here, after = tuple_(col, EntryRow.key), tuple_(bindparam("after_value"), key)
            q = q.where(here < after if desc else here > after)
    keys = EntryRow.key.desc() if desc else EntryRow.key
    q = q.order_by(keys) if sort == "name" else q.order_by(col.desc() if desc else col, keys)
    return q.limit(bindparam("page_limit"))


def entry_jobs(s: Session | Connection, cache: str, key: str) -> list[dict]:
    """Every job that reported the key, with its hits, compiles, writes, processes and last report (no warm-ups)."""
    rows = s.execute(
        select(UsageRow.job, func.sum(UsageRow.hits), func.sum(UsageRow.compiles), func.sum(UsageRow.writes),
               func.sum(UsageRow.processes), func.max(UsageRow.last_at), func.sum(UsageRow.saved_s))
        .where(UsageRow.cache == cache, UsageRow.key == key, UsageRow.kind == JOB)
        .group_by(UsageRow.job).order_by(UsageRow.job)
    ).all()
    return [{"job": j, "hits": int(h or 0), "compiles": int(c or 0), "writes": int(w or 0), "processes": int(n),
             "last_s": last or None, "saved_s": float(sv or 0)} for j, h, c, w, n, last, sv in rows]


def entry_detail(conn: Connection, cache: str, key: str,
                 root: str) -> tuple[dict, list[dict], Row | None, dict | None] | None:
    """An entry's fields (of the cache at ``root``), jobs, last verdict and digest conflict (each None if none); None
    for no such entry."""
    row = conn.execute(select(*_PAGE_COLUMNS).where(
        EntryRow.cache == cache, EntryRow.key == key, EntryRow.kind == "entry")).first()
    if row is None:
        return None
    verdict = conn.execute(select(VerificationRow).where(VerificationRow.cache == cache,
                                                          VerificationRow.key == key)).first()
    conflict = next(iter(attestations.conflicts(conn, cache, keys=[key])), None)
    return page_entry(row, root), entry_jobs(conn, cache, key), verdict, conflict
