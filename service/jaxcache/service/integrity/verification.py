"""Integrity passes: verdicts kept per entry version, so a pass reads only new, changed, re-attested or pending
entries; throttled in the background loop (it shares the GIL with the API), flat out on ``POST .../verify``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

from sqlalchemy import and_, delete, func, or_, select

from jaxcache import integrity
from jaxcache.parallel import bounded_map
from jaxcache.scan import Entry
from jaxcache.service.catalog import attestations
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.catalog.models import AttestationRow, EntryRow, VerificationRow
from jaxcache.service.integrity import queries
from jaxcache.service.integrity.schemas import VerifyResult
from jaxcache.service.metrics import Metrics
from jaxcache.service.state import State
from jaxcache.signing import TrustedKeys
from jaxcache.storage import Storage

_BATCH = 256
_THROTTLED_BATCH = 32


def _upsert(catalog: Catalog):
    insert = catalog.insert(VerificationRow)
    return insert.on_conflict_do_update(index_elements=["cache", "key"], set_={
        c.name: insert.excluded[c.name] for c in VerificationRow.__table__.columns if not c.primary_key})


def _todo(cache: str, trusted: TrustedKeys):
    """Entries whose verdict is missing, stale (other version, digest or trusted keys) or pending."""
    v, a = VerificationRow, AttestationRow
    return (
        select(EntryRow.key, EntryRow.module, EntryRow.name, EntryRow.size_bytes, EntryRow.created_s,
               EntryRow.version)
        .outerjoin(v, and_(v.cache == EntryRow.cache, v.key == EntryRow.key))
        .outerjoin(a, and_(a.cache == EntryRow.cache, a.key == EntryRow.key))
        .where(EntryRow.cache == cache, EntryRow.kind == "entry")
        .where(or_(
            v.key.is_(None), v.size_bytes != EntryRow.size_bytes, v.created_s != EntryRow.created_s,
            and_(EntryRow.version.is_not(None), or_(v.version.is_(None), v.version != EntryRow.version)),
            v.classification == integrity.PENDING, v.trusted.is_(None), v.trusted != trusted.digest(),
            and_(a.sha256.is_not(None), or_(v.attested_sha256.is_(None), v.attested_sha256 != a.sha256)),
        ))
        .order_by(EntryRow.key)
    )


def run_pass(
    catalog: Catalog, cache: str, storage: Storage, *, min_age_s: float, max_entries: int | None = None,
    bytes_per_s: float | None = None, cpu_share: float | None = None, stop: threading.Event | None = None,
    recheck_all: bool = False, clock: Callable[[], float] = time.time, progress: Callable[[], None] | None = None,
    trusted: TrustedKeys | None = None,
) -> VerifyResult:
    """Verify what needs it (all with ``recheck_all``), at most ``max_entries``, throttled to ``bytes_per_s`` and
    ``cpu_share`` of a core when given, against ``trusted``; ``progress`` is called after each batch."""
    keys = TrustedKeys.from_env() if trusted is None else trusted
    trust, started, cpu_started = keys.digest(), time.monotonic(), time.thread_time()
    # Throttled, a batch is a short burst between sleeps, so requests never queue behind a long one.
    batch_size = _BATCH if cpu_share is None else _THROTTLED_BATCH
    result = VerifyResult(cache=cache, checked=0, bytes_read=0, counts={}, remaining=0, seconds=0.0)
    if recheck_all:
        with catalog.writing(cache) as s:
            s.execute(delete(VerificationRow).where(VerificationRow.cache == cache))
    after = ""  # keyset over the key: each entry at most once per pass (pending ones come back next pass)
    while stop is None or not stop.is_set():
        budget = batch_size if max_entries is None else min(batch_size, max_entries - result.checked)
        if budget <= 0:
            break
        with catalog.reader() as conn:
            batch = conn.execute(_todo(cache, keys).where(EntryRow.key > after).limit(budget)).all()
            found = attestations.load(conn, cache, [r.key for r in batch])
        if not batch:
            break
        after = batch[-1].key
        now = clock()
        entries = [Entry(key=r.key, module=r.module, hash=r.key[-64:], name=r.name, size_bytes=r.size_bytes,
                         mtime_s=r.created_s, version=r.version) for r in batch]
        judged = list(bounded_map(partial(integrity.judge_stored, storage, found, keys, now, min_age_s), entries,
                                  workers=storage.io_workers))
        rows = []
        for entry, verdict in zip(entries, judged, strict=True):
            if verdict is None:  # deleted since the last rescan (which will drop its row), or not a file now
                continue
            att = found.get(entry.key)
            rows.append(dict(
                cache=cache, key=entry.key, classification=verdict.classification, classes=list(verdict.classes),
                reasons=list(verdict.reasons), sha256=verdict.sha256, attested_sha256=att.sha256 if att else None,
                attested_by=verdict.attested_by, embedded_module=verdict.embedded_module, size_bytes=entry.size_bytes,
                created_s=entry.mtime_s, version=entry.version, checked_s=now, trusted=trust,
                signature=verdict.signature))
            result.counts[verdict.classification] = result.counts.get(verdict.classification, 0) + 1
            result.bytes_read += verdict.size_bytes
        if rows:
            with catalog.writing(cache) as s:
                s.execute(_upsert(catalog), rows)  # one statement per batch: an ORM merge read each row first
        result.checked += len(rows)
        if progress is not None:
            progress()
        if len(batch) < budget:
            break
        # Sleep so that the pass averages at most bytes_per_s and cpu_share since it started.
        elapsed = time.monotonic() - started
        ahead = max(result.bytes_read / bytes_per_s - elapsed if bytes_per_s else 0.0,
                    (time.thread_time() - cpu_started) / cpu_share - elapsed if cpu_share else 0.0)
        if ahead > 0:
            if stop is None:
                time.sleep(ahead)
            elif stop.wait(ahead):
                break
    result.remaining = unjudged(catalog, cache, keys)
    result.seconds = time.monotonic() - started
    return result


def unjudged(catalog: Catalog, cache: str, trusted: TrustedKeys) -> int:
    """Entries with no verdict for their current version, digest or trusted keys yet."""
    with catalog.reader() as conn:
        count: int = conn.execute(select(func.count()).select_from(_todo(cache, trusted).subquery())).scalar_one()
    return count


#: Rescans ``name`` unless this process has seen a scan of it (rounds.ensure_scanned, handed in by app.py).
Scanned = Callable[[str], None]


def verify(state: State, name: str, *, ensure_scanned: Scanned, max_entries: int | None = None,
           recheck_all: bool = False, stop: threading.Event | None = None, throttled: bool = False) -> VerifyResult:
    """One integrity pass over ``name`` (only what needs it unless ``recheck_all``), once it was scanned."""
    ensure_scanned(name)
    settings = state.settings
    result = run_pass(
        state.catalog, name, state.storages[name], min_age_s=settings.verify_min_age_s, max_entries=max_entries,
        recheck_all=recheck_all, stop=stop, bytes_per_s=settings.verify_bytes_per_s if throttled else None,
        cpu_share=settings.verify_cpu_share if throttled else None, progress=state.loops.progress,
        trusted=settings.trusted)
    refresh_gauges(state.metrics, state.catalog, name)
    return result


def refresh_gauges(metrics: Metrics, catalog: Catalog, name: str) -> None:
    """Set ``name``'s entries by integrity class (every class, 0 where none) from the catalog's verdicts."""
    with catalog.reader() as conn:
        counts = queries.summary(conn, name, limit=0)["counts"]
    for cls, n in counts.items():
        metrics.integrity.labels(name, cls).set(n)


def verify_all(state: State, stop: threading.Event, *, ensure_scanned: Scanned) -> list[tuple[str, Exception]]:
    """One throttled integrity pass over every cache; the caches whose pass failed, with why."""
    failed: list[tuple[str, Exception]] = []
    for name in state.settings.caches:
        if stop.is_set():
            break
        state.loops.on_cache(name)
        try:
            verify(state, name, ensure_scanned=ensure_scanned, stop=stop, throttled=True)
        except Exception as exc:  # noqa: BLE001 - one cache's failure must not stop the others' passes
            failed.append((name, exc))
    return failed
