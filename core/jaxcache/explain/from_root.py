"""A cache root as an explainer's history, with no service: its run and warm-up records say who looked up which
key with which parts, its listing says which entries are there (read only for the few misses that need it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial

from jaxcache import coverage, records, usage_rules
from jaxcache import entry as fmt
from jaxcache.errors import InvalidInputError, NotRegularFileError
from jaxcache.explain.model import Deletion, EntryNow, Known
from jaxcache.parallel import bounded_map
from jaxcache.storage import ObjectInfo, Storage
from jaxcache.storage.base import name_problem
from jaxcache.usage_rules import PY

#: How JAX names the compression library it hashes, by the compression an entry's magic bytes show.
LIBRARY = {fmt.Compression.ZSTD: "zstandard", fmt.Compression.ZLIB: "zlib"}


def knowns_of_run(record: records.RunRecord) -> Iterator[Known]:
    """What one run record says about each key it names."""
    for u in record.keys:
        yield _known(record, u)


def knowns_of_warmup(warm: coverage.WarmupRecord) -> Iterator[Known]:
    """What one warm-up's coverage record says: programs it wrote, found, or compiled without writing."""
    events = {coverage.WRITTEN: "write", coverage.PRESENT: "hit", coverage.NOT_WRITTEN: "compiled"}
    for p in warm.programs:
        yield Known(key=p.key, function=p.function, event=events[p.status], at=warm.started_at, job=warm.job,
                    run_id=warm.id, kind="warmup", parts=p.parts, program=p.program, fingerprint=warm.fingerprint,
                    topology=warm.topology, reason=p.reason, compile_s=p.compile_s)


def is_miss(k: Known) -> bool:
    """A job's process compiled the key: the cache did not give it."""
    return usage_rules.is_miss(PY, k.kind, k.event) is True


class RootHistory:
    """The records and entries of one root, indexed for :func:`jaxcache.explain.explain`."""

    def __init__(self, storage: Storage, knowns: Iterable[Known], listing: Iterable[ObjectInfo]) -> None:
        self._storage = storage
        self._by_key: dict[str, list[Known]] = defaultdict(list)
        self._by_function: dict[str, list[Known]] = defaultdict(list)
        for k in knowns:
            self._by_key[k.key].append(k)
            self._by_function[k.function].append(k)
        self._entries: dict[str, ObjectInfo] = {}
        self._of_module: dict[str, list[str]] = defaultdict(list)
        for info in listing:
            name = fmt.parse_name(info.name)
            if name is not None and name.kind is fmt.EntryKind.CACHE:
                self._entries[name.key] = info
                self._of_module[name.module].append(name.key)
        self._checked: dict[str, EntryNow] = {}

    @property
    def knowns(self) -> Iterator[Known]:
        for ks in self._by_key.values():
            yield from ks

    def entry(self, key: str) -> EntryNow | None:
        """The entry, decompressed once to tell whether JAX could load it."""
        info = self._entries.get(key)
        if info is None:
            return None
        if key not in self._checked:
            try:
                chunks = self._storage.read_chunks(info.name)
            except NotRegularFileError:
                return None  # not a regular file any more: skipped (counted in storage.skipped)
            if chunks is None:
                return None
            v = fmt.validate_chunks(chunks)
            self._checked[key] = EntryNow(key, info.mtime_s, readable=v.status is fmt.Status.OK,
                                          compression=LIBRARY.get(v.compression), problem=v.reason)
        return self._checked[key]

    def deletion(self, key: str, *, before: float) -> Deletion | None:
        return None  # a root keeps no audit log: the service's catalog does

    def earlier(self, key: str, *, before: float) -> list[Known]:
        return [k for k in self._by_key.get(key, ()) if k.at < before]

    def of_function(self, function: str) -> list[Known]:
        return self._by_function.get(function, [])

    def entries_of_function(self, function: str) -> list[EntryNow]:
        """A few of the function's entries, with the compression their first bytes show."""
        out = []
        for key in self._of_module.get(function, [])[:3]:
            info = self._entries[key]
            try:
                head = self._storage.read_range(info.name, 0, 8) or b""
            except NotRegularFileError:
                continue  # not a regular file, or stored with a Content-Encoding: skipped (counted in storage.skipped)
            out.append(EntryNow(key, info.mtime_s, compression=LIBRARY.get(fmt.sniff_compression(head))))
        return out


@dataclass
class RootRecords:
    """A root's run and warm-up records as knowns, the jobs and runs they name, and how many were malformed."""

    knowns: list[Known]
    skipped: int
    jobs: set[str] = field(default_factory=set)
    runs: set[str] = field(default_factory=set)


def read_records(storage: Storage) -> tuple[list[Known], int]:
    """Every run and warm-up record of the root as knowns, and how many records were malformed (skipped)."""
    found = read_root(storage)
    return found.knowns, found.skipped


def read_root(storage: Storage) -> RootRecords:
    """Every run and warm-up record of the root, as :class:`RootRecords`.

    Hits are by far the most numerous and matter only as "someone had it then": of each key's hits, the first and
    the last are kept (the jobs and runs every record names are kept whole)."""
    names = [i for i in storage.iter_objects(records.RECORDS_DIR + "/", recursive=True) if i.name.endswith(".json")]
    out = RootRecords([], 0)
    knowns = out.knowns
    hits: dict[str, list[tuple[float, records.RunRecord, records.KeyUsage]]] = {}
    for found in bounded_map(partial(_read, storage), names, workers=storage.io_workers):
        if found is _MALFORMED:
            out.skipped += 1
        elif isinstance(found, coverage.WarmupRecord):
            out.jobs.add(found.job)
            out.runs.add(found.id)
            knowns.extend(knowns_of_warmup(found))
        elif isinstance(found, records.RunRecord):
            out.jobs.add(found.job)
            out.runs.add(found.run_id)
            for u in found.keys:
                if u.event != records.HIT:
                    knowns.append(_known(found, u))
                    continue
                at = u.first_at or found.started_at
                ends = hits.get(u.key)
                if ends is None:
                    hits[u.key] = [(at, found, u), (at, found, u)]
                elif at < ends[0][0]:
                    ends[0] = (at, found, u)
                elif at > ends[1][0]:
                    ends[1] = (at, found, u)
    for ends in hits.values():
        knowns.extend(_known(r, u) for _, r, u in (ends if ends[0][0] != ends[1][0] else ends[:1]))
    return out


def _known(record: records.RunRecord, u: records.KeyUsage) -> Known:
    return Known(key=u.key, function=u.function, event=u.event, at=u.first_at or record.started_at, job=record.job,
                 run_id=record.run_id, process_index=record.process_index, kind=record.kind, parts=u.parts,
                 program=u.program, fingerprint=record.fingerprint, topology=record.topology, reason=u.reason,
                 compile_s=u.compile_s)


_MALFORMED = object()


def _read(storage: Storage, info: ObjectInfo) -> object:
    """The parsed record; None for an object that is gone or not a record (or one skipped: not a regular file, a name
    that cannot be read, counted in ``storage.skipped``); ``_MALFORMED``."""
    if (why := name_problem(info.name)) is not None:
        storage.skipped.add(info.name, why)
        return None
    parse: Callable[[bytes], object]
    if records.is_record_name(info.name):
        parse, bound = records.parse, records.MAX_RECORD_BYTES
    elif info.name.startswith(coverage.WARMUPS_PREFIX):
        parse, bound = coverage.parse, coverage.MAX_COVERAGE_BYTES
    else:
        return None
    try:
        data = storage.read_bounded(info.name, bound, listed_bytes=info.size_bytes)
        return None if data is None else parse(data)
    except NotRegularFileError:
        return None
    except InvalidInputError:  # larger than the bound (never read past it), or not a record
        return _MALFORMED
