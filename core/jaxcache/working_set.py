"""A job's working set: the cache keys it is about to need, read from what its recent runs and warm-ups recorded.

The node-local tier prefetches it before JAX asks (``jaxcache.client``), and ``jaxcache bundle export`` carries it
as one archive. The set comes from the root's records here; the service answers the same set from its catalog, and
a job's starts read it from the job's index in the root (:mod:`jaxcache.working_set_index`, one request), which
chooses the same way.

Which runs count: the job's newest process-0 records (jobs, not warm-ups) whose fingerprint matches what the
process knows of itself (jaxlib, backend, device kind and count). A field not known yet (the backend starts at the
first compile) is taken from the newest matching run, so the set never mixes two device layouts. SPMD processes
compile the same programs, so process 0's record stands for its run. Keys a run hit or wrote count; keys it only
compiled (nothing stored, or an entry it refused) do not. Warm-ups add the keys their coverage says are there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError, NotRegularFileError, TooLargeError
from jaxcache.parallel import bounded_map
from jaxcache.records import Fingerprint, RunRecord
from jaxcache.storage.base import ObjectInfo, Storage

MATCHED = ("jaxlib", "backend", "device_kind", "device_count")  # the fingerprint fields a working set must share
DEFAULT_RUNS = 3
DEFAULT_DAYS = 14
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Wanted:
    """The fingerprint fields a set must match; None: not known yet, taken from the newest matching run."""

    jaxlib: str | None = None
    backend: str | None = None
    device_kind: str | None = None
    device_count: int | None = None

    @classmethod
    def of(cls, fingerprint: Fingerprint) -> Wanted:
        """What ``fingerprint`` knows of the matched fields."""
        return cls(**{f: getattr(fingerprint, f) for f in MATCHED})

    def matches(self, fingerprint: Fingerprint) -> bool:
        """True when every field known here equals ``fingerprint``'s."""
        return all(v is None or getattr(fingerprint, f) == v for f, v in dataclasses.asdict(self).items())

    def filled_from(self, fingerprint: Fingerprint) -> Wanted:
        """This, with the fields not known yet taken from ``fingerprint``."""
        return Wanted(**{f: getattr(fingerprint, f) if v is None else v for f, v in dataclasses.asdict(self).items()})

    def as_params(self) -> dict[str, str]:
        """The known fields as query parameters (the service's working-set request)."""
        return {f: str(v) for f, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class Measured:
    """What a job's hits of each key are worth, as its working-set index knows (:func:`jaxcache.working_set_index.
    measured`): the compile seconds its runs measured on this device kind (``platform``), else a warm-up's on the
    machine it compiled on (``writers``: seconds, machine)."""

    platform: Mapping[str, float] = field(default_factory=dict)
    writers: Mapping[str, tuple[float, str | None]] = field(default_factory=dict)


@dataclass(slots=True)
class WorkingSet:
    """The keys a job is expected to need, in the order its newest run first used them (warm-ups' keys last)."""

    job: str
    keys: list[str] = field(default_factory=list)
    sha256: dict[str, str] = field(default_factory=dict)  # a key's digest as its writer recorded it, where known
    fingerprint: Fingerprint | None = None  # of the newest run or warm-up the set came from
    runs: list[str] = field(default_factory=list)  # the run ids it came from
    warmups: list[str] = field(default_factory=list)  # the warm-up ids it came from
    #: What its keys' hits are worth, where the set came from the job's index (the client's seconds saved): beside
    #: the set, neither compared nor in its JSON. None: not known (a set from the records or the service).
    measured: Measured | None = field(default=None, compare=False, repr=False)

    def to_builtins(self) -> dict[str, Any]:
        """As JSON-ready builtins (the service's answer, a bundle's manifest)."""
        data = dataclasses.asdict(self)
        data.pop("measured")
        data["fingerprint"] = None if self.fingerprint is None else self.fingerprint.as_dict()
        return data

    @classmethod
    def from_builtins(cls, data: Any) -> WorkingSet:
        """Parse :meth:`to_builtins`'s shape; :class:`InvalidInputError` says what is wrong."""
        try:
            return msgspec.convert(data, _Shape).as_set()
        except (msgspec.ValidationError, ValueError) as exc:
            raise InvalidInputError(f"not a working set: {exc}") from None


class _Shape(msgspec.Struct):
    job: records.Job
    keys: list[records.Key]
    sha256: dict[records.Key, records.Sha256] = {}
    fingerprint: Fingerprint | None = None
    runs: list[str] = []
    warmups: list[str] = []

    def as_set(self) -> WorkingSet:
        keys = list(dict.fromkeys(self.keys))
        return WorkingSet(job=self.job, keys=keys, sha256={k: v for k, v in self.sha256.items() if k in keys},
                          fingerprint=self.fingerprint, runs=self.runs, warmups=self.warmups)


class Builder:
    """A set as its sources are read: each key once, where it first came; the first digest a source gives."""

    def __init__(self, job: str) -> None:
        self.found = WorkingSet(job=job)
        self._seen: dict[str, None] = {}

    def add(self, key: str, sha256: str | None) -> None:
        self._seen.setdefault(key)
        if sha256 is not None:
            self.found.sha256.setdefault(key, sha256)

    def done(self) -> WorkingSet:
        self.found.keys = list(self._seen)
        return self.found


def _read(storage: Storage, info: ObjectInfo, limit: int) -> bytes | TooLargeError | None:
    try:
        return storage.read_bounded(info.name, limit, listed_bytes=info.size_bytes)
    except TooLargeError as exc:
        return exc
    except NotRegularFileError:
        return None


def _newest_first(storage: Storage, prefix: str, keep: Any) -> list[ObjectInfo]:
    return sorted((i for i in storage.iter_objects(prefix, recursive=True) if keep(i.name)),
                  key=lambda i: i.mtime_s, reverse=True)


def _parsed(storage: Storage, infos: list[ObjectInfo], limit: int, parse: Callable[[bytes], T],
            malformed: list[tuple[str, str]] | None = None) -> Iterator[T]:
    """The objects ``infos`` names, read in parallel (each to at most ``limit`` bytes) and parsed, in order;
    unreadable or malformed ones left out, the malformed named in ``malformed`` with why."""
    for info, data in zip(infos, bounded_map(lambda i: _read(storage, i, limit), infos, workers=storage.io_workers),
                          strict=True):
        if data is None:
            continue
        try:
            if isinstance(data, TooLargeError):
                raise data
            yield parse(data)
        except InvalidInputError as exc:
            if malformed is not None:
                malformed.append((info.name, str(exc)))


def job_runs(storage: Storage, job: str, *, days: int = DEFAULT_DAYS, now: float | None = None,
             malformed: list[tuple[str, str]] | None = None) -> Iterator[RunRecord]:
    """The job's process-0 job records within ``days`` days, newest day first and newest object first within a day
    (read lazily, a day's listing at a time: the first few answer without reading the rest of a large root).
    Unreadable ones are passed over; malformed ones (more than :data:`records.MAX_RECORD_BYTES`, not a record) too,
    each named in ``malformed`` with why."""
    today = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC).date()
    for back in range(days):
        day = (today - dt.timedelta(days=back)).isoformat()
        infos = _newest_first(storage, f"{records.RUNS_PREFIX}{day}/", lambda n: n.endswith("-p0.json"))
        for record in _parsed(storage, infos, records.MAX_RECORD_BYTES, records.parse, malformed):
            if record.job == job and record.kind == records.JOB:
                yield record


def from_root(storage: Storage, job: str, wanted: Wanted, *, runs: int = DEFAULT_RUNS, days: int = DEFAULT_DAYS,
              now: float | None = None) -> WorkingSet:
    """``job``'s working set from the records under ``storage``: its newest ``runs`` matching runs within
    ``days`` days, and its warm-ups' coverage for the same fingerprint."""
    built = Builder(records.check_job(job))
    taken: list[RunRecord] = []
    now = time.time() if now is None else now
    for record in job_runs(storage, job, days=days, now=now):
        if not wanted.matches(record.fingerprint):
            continue
        if not taken:
            wanted = wanted.filled_from(record.fingerprint)
            built.found.fingerprint = record.fingerprint
        taken.append(record)
        if len(taken) >= runs:
            break
    for record in taken:  # the newest run's order of first use leads: that is the order JAX will ask
        built.found.runs.append(record.run_id)
        for u in sorted(record.keys, key=lambda u: u.first_at):
            if u.event != records.COMPILED:
                built.add(u.key, u.sha256)
    since = now - days * 86400.0
    infos = [i for i in _newest_first(storage, coverage.WARMUPS_PREFIX, lambda n: n.endswith(".json"))
             if i.mtime_s >= since]
    for warm in _parsed(storage, infos, coverage.MAX_COVERAGE_BYTES, coverage.parse):
        if warm.job != job or not wanted.matches(warm.fingerprint):
            continue
        if built.found.fingerprint is None:
            wanted = wanted.filled_from(warm.fingerprint)
            built.found.fingerprint = warm.fingerprint
        built.found.warmups.append(warm.id)
        for p in warm.programs:
            if p.status != coverage.NOT_WRITTEN:
                built.add(p.key, p.sha256)
    return built.done()
