"""Catalog queries behind the routes and pages, under the names callers use (``queries.list_entries``)."""

from __future__ import annotations

from jaxcache.service.catalog.queries.audit import prunes
from jaxcache.service.catalog.queries.listing import (
    PAGE_FIELDS,
    SORTS,
    WRITER_FIELDS,
    EntryFilter,
    entry_columns,
    entry_detail,
    entry_jobs,
    glob_match,
    glob_pattern,
    glob_to_like,
    list_entries,
    page_entry,
)
from jaxcache.service.catalog.queries.misses import misses_by_cause
from jaxcache.service.catalog.queries.totals import cache_totals, day_of, stats
from jaxcache.service.catalog.queries.usage import (
    job_misses,
    job_runs,
    jobs,
    recent_jaxlibs,
    saved_by_function,
    usage_window,
)

__all__ = [
    "PAGE_FIELDS", "SORTS", "WRITER_FIELDS", "EntryFilter", "cache_totals", "day_of", "entry_columns", "entry_detail",
    "entry_jobs", "glob_match", "glob_pattern", "glob_to_like", "job_misses", "job_runs", "jobs", "list_entries",
    "misses_by_cause", "page_entry", "prunes", "recent_jaxlibs", "saved_by_function", "stats", "usage_window",
]
