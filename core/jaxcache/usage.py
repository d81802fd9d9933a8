"""What a root's run records say about its entries: last hits, the first writer's jaxlib, the jaxlib versions in use.

``jaxcache prune`` reads this straight from ``<root>/.jaxcache/runs/`` so that, without a service, ``--max-size``
and ``--unused-for`` count reported hits (the only record of use an object store's root has) and ``--stale-jaxlib``
works. The service keeps the same facts in its catalog (``jaxcache.service.reports.fold``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jaxcache import records, usage_rules
from jaxcache.errors import InvalidInputError, NotRegularFileError, TooLargeError
from jaxcache.parallel import bounded_map
from jaxcache.prune import Candidate
from jaxcache.storage.base import ObjectInfo, Storage, name_problem
from jaxcache.usage_rules import PY


@dataclass(slots=True)
class RecordedUse:
    """Facts from every readable run record under a root."""

    last_hit_s: dict[str, float] = field(default_factory=dict)  # key -> newest hit a job reported
    writer_jaxlib: dict[str, str] = field(default_factory=dict)  # key -> jaxlib of its earliest writer
    runs: list[tuple[float, str]] = field(default_factory=list)  # (updated_at, jaxlib) per process record
    records: int = 0
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (object name, why)

    def recent_jaxlibs(self, since_s: float) -> set[str]:
        """jaxlib versions of processes whose records were updated at or after ``since_s``."""
        return {jaxlib for at, jaxlib in self.runs if usage_rules.is_recent(PY, at, since_s)}

    def apply_to(self, candidate: Candidate) -> Candidate:
        """``candidate`` with its last reported hit and writer's jaxlib filled in (orphans stay as they are)."""
        if candidate.orphan:
            return candidate
        hit, jaxlib = self.last_hit_s.get(candidate.key), self.writer_jaxlib.get(candidate.key)
        if hit is None and jaxlib is None:
            return candidate
        return dataclasses.replace(candidate, last_hit_s=hit, writer_jaxlib=jaxlib)


def _read(storage: Storage, info: ObjectInfo) -> tuple[str, bytes | None, str | None]:
    try:
        return info.name, storage.read_bounded(info.name, records.MAX_RECORD_BYTES, listed_bytes=info.size_bytes), None
    except TooLargeError as exc:
        return info.name, None, str(exc)
    except NotRegularFileError:
        return info.name, None, None  # replaced since the listing: skipped (counted in storage.skipped)


def read_usage(storage: Storage) -> RecordedUse:
    """Read every run record under ``storage``'s ``.jaxcache/runs/``; malformed ones are listed, not fatal."""
    use = RecordedUse()
    # key -> (usage_rules.writer_order, jaxlib) of the earliest writer so far
    writers: dict[str, tuple[Any, ...]] = {}
    infos = []
    for info in storage.iter_objects(records.RUNS_PREFIX, recursive=True):
        if not records.is_record_name(info.name):
            continue
        if (why := name_problem(info.name)) is not None:  # `..`, `//`, `\` in an object's name: not fatal
            storage.skipped.add(info.name, why)
            continue
        infos.append(info)
    for name, data, error in bounded_map(lambda i: _read(storage, i), infos, workers=storage.io_workers):
        if data is None and error is None:
            continue  # deleted since the listing
        if data is not None and error is None:
            try:
                record = records.parse(data)
            except InvalidInputError as exc:
                error = str(exc)
        if error is not None:
            use.malformed.append((name, error))
            continue
        use.records += 1
        jaxlib = record.fingerprint.jaxlib
        use.runs.append((record.updated_at, jaxlib))
        for u in record.keys:
            hit = usage_rules.hit_at(PY, record.kind, u.hits, u.first_at, u.last_at)
            if hit is not None and hit > use.last_hit_s.get(u.key, float("-inf")):
                use.last_hit_s[u.key] = hit
            at = usage_rules.write_at(PY, u.event, u.writes, u.first_at, record.started_at)
            if at is not None:
                mine = (*usage_rules.writer_order(PY, at, record.run_id, record.process_index), jaxlib)
                if u.key not in writers or mine < writers[u.key]:
                    writers[u.key] = mine
    use.writer_jaxlib = {key: w[-1] for key, w in writers.items()}
    return use
