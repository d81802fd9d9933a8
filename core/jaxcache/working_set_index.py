"""A job's working sets in one small object of the root, which a node's start reads in one request where no service
answers (``<root>/.jaxcache/working-sets/<job>.json``, schema ``jaxcache.working-sets/1``), instead of listing days
of run records and every warm-up's coverage (:func:`jaxcache.working_set.from_root`) on every start of every node.

Process 0 of each run merges what it hit and wrote at exit, a warm-up its coverage: read with its version, merged,
written only if still that version (created where absent), merged again when another writer came first. A start
chooses from it as ``from_root`` does. Bounded, so one GET stays small: per fingerprint (the ``MATCHED`` fields) the
newest 3 runs (all a set takes) and :data:`MAX_WARMUPS` warm-ups of the last 14 days, :data:`MAX_GROUPS`
fingerprints (a job moved across that many jaxlibs or device layouts within them), :data:`MAX_INDEX_BYTES` in all
(the oldest fingerprints, then the oldest runs and warm-ups go first; one run larger than that keeps the keys it
used first). It also says what the job's hits are worth (:func:`measured`): the compile seconds its runs measured per
fingerprint (one device kind: the platform's own), and its warm-ups' with the machine they compiled on.
"""

from __future__ import annotations

import random
import time
import urllib.parse
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError, PreconditionFailedError, TooLargeError
from jaxcache.records import Fingerprint, Key, RunRecord, Seconds, Sha256, Text
from jaxcache.storage.base import Storage
from jaxcache.working_set import DEFAULT_DAYS, DEFAULT_RUNS, MATCHED, Builder, Measured, Wanted, WorkingSet

SCHEMA = "jaxcache.working-sets/1"
INDEX_PREFIX = f"{records.RECORDS_DIR}/working-sets/"
MAX_INDEX_BYTES = 8 * 1024 * 1024  # some 50,000 keys with their digests: one GET of a few MB at most
MAX_GROUPS = 8
MAX_WARMUPS = 8
UPDATE_ATTEMPTS = 5  # read-merge-write rounds against other writers of the same job's index


class Source(msgspec.Struct, frozen=True, gc=False):
    """One run (its process 0) or warm-up: its keys that a set takes (a run's hits and writes in order of first use,
    a warm-up's programs that are there), with the digests its writer recorded."""

    id: records.RunId
    at: records.Seconds  # when it ended (a run's last record, a warm-up's finish)
    keys: list[Key] = []
    sha256: dict[Key, Sha256] = {}
    # A warm-up's: the compile seconds it measured of the programs it wrote, and the machine it compiled them on
    # (records.machine_of). A run's measures go to its group (Group.compile_s).
    compile_s: dict[Key, Seconds] = {}
    machine: Text | None = None


class Group(msgspec.Struct, gc=False):
    """The runs and warm-ups of one fingerprint (its :data:`MATCHED` fields), newest first."""

    fingerprint: Fingerprint  # of the newest run (else warm-up) of the group
    runs: list[Source] = []
    warmups: list[Source] = []
    # The compile seconds the group's runs (jobs, on this fingerprint's device kind) measured of each key some source
    # still names: the earliest measure, as the service credits it (usage_rules.credited_measure).
    compile_s: dict[Key, Seconds] = {}

    @property
    def newest_run_at(self) -> float:
        return max((s.at for s in self.runs), default=-1.0)

    @property
    def newest_at(self) -> float:
        return max(self.newest_run_at, max((s.at for s in self.warmups), default=-1.0))


class JobIndex(msgspec.Struct, tag_field="schema", tag=SCHEMA):
    """One job's index. Its ``schema`` field (``jaxcache.working-sets/1``) is the struct's tag."""

    job: Annotated[str, msgspec.Meta(pattern=r"^[^\x00-\x1f/\\]{1,200}$")]
    groups: list[Group] = []


def index_name(job: str) -> str:
    """The index's object name under the root: the job's name percent-encoded (any job name is one object name)."""
    return f"{INDEX_PREFIX}{urllib.parse.quote(records.check_job(job), safe='')}.json"


def parse(data: bytes) -> JobIndex:
    """An index as stored; :class:`InvalidInputError` says what is wrong."""
    found: JobIndex = records.decode(data, JobIndex, "working-set index", MAX_INDEX_BYTES)
    return found


def read_index(storage: Storage, job: str) -> JobIndex | None:
    """The job's index (one read of at most :data:`MAX_INDEX_BYTES`), None where there is none; raises
    :class:`InvalidInputError` for one that is not an index (or not this job's)."""
    try:
        data = storage.read_bounded(index_name(job), MAX_INDEX_BYTES)
    except TooLargeError as exc:
        raise InvalidInputError(f"{index_name(job)} in {storage.url} is {exc}: not a working-set index") from None
    if data is None:
        return None
    index = parse(data)
    if index.job != job:
        raise InvalidInputError(f"{index_name(job)} in {storage.url} is the index of job {index.job!r}")
    return index


def from_index(storage: Storage, job: str, wanted: Wanted, *, runs: int = DEFAULT_RUNS, days: int = DEFAULT_DAYS,
               now: float | None = None) -> WorkingSet | None:
    """``job``'s working set from its index (one request), chosen as :func:`jaxcache.working_set.from_root` chooses
    from the records; None where the root holds no index for the job."""
    index = read_index(storage, job)
    if index is None:
        return None
    return choose(index, wanted, runs=runs, days=days, now=now)


def choose(index: JobIndex, wanted: Wanted, *, runs: int = DEFAULT_RUNS, days: int = DEFAULT_DAYS,
           now: float | None = None) -> WorkingSet:
    """The set of ``index``: the fingerprint of the newest run matching ``wanted`` (else of the newest warm-up), its
    newest ``runs`` runs' keys in order, then its warm-ups', all within ``days`` days."""
    built = Builder(index.job)
    group = _chosen(index, wanted, days, now)
    if group is None:
        return built.done()
    built.found.fingerprint = group.fingerprint
    built.found.measured = _measured_of(group)
    for run in group.runs[:runs]:
        built.found.runs.append(run.id)
        for key in run.keys:
            built.add(key, run.sha256.get(key))
    for warm in group.warmups:
        built.found.warmups.append(warm.id)
        for key in warm.keys:
            built.add(key, warm.sha256.get(key))
    return built.done()


def _chosen(index: JobIndex, wanted: Wanted, days: int, now: float | None) -> Group | None:
    """The group a set comes from: of the newest run matching ``wanted``, else of the newest warm-up; None: none."""
    since = (time.time() if now is None else now) - days * 86400.0
    fresh = [_within(g, since) for g in index.groups if wanted.matches(g.fingerprint)]
    fresh = [g for g in fresh if g.runs or g.warmups]
    if not fresh:
        return None
    with_runs = [g for g in fresh if g.runs]
    return max(with_runs, key=lambda g: g.newest_run_at) if with_runs else max(fresh, key=lambda g: g.newest_at)


def _within(group: Group, since: float) -> Group:
    return _measures_kept(Group(group.fingerprint, [s for s in group.runs if s.at >= since],
                                [s for s in group.warmups if s.at >= since], group.compile_s))


def _measures_kept(group: Group) -> Group:
    """``group`` with the measures of the keys its sources still name only (what bounds them)."""
    named = {k for s in (*group.runs, *group.warmups) for k in s.keys}
    group.compile_s = {k: v for k, v in group.compile_s.items() if k in named}
    return group


def measured(index: JobIndex | None, wanted: Wanted, *, days: int = DEFAULT_DAYS, now: float | None = None) -> Measured:
    """The measures of the group a set for ``wanted`` comes from (:func:`choose`'s); empty without one."""
    group = None if index is None else _chosen(index, wanted, days, now)
    return Measured() if group is None else _measured_of(group)


def _measured_of(group: Group) -> Measured:
    writers: dict[str, tuple[float, str | None]] = {}
    for warm in sorted(group.warmups, key=lambda s: s.at):  # the earliest warm-up that wrote a key wrote it
        for key, seconds in warm.compile_s.items():
            writers.setdefault(key, (seconds, warm.machine))
    return Measured(dict(group.compile_s), writers)


# -- updates -------------------------------------------------------------------------------------------------------


def run_source(record: RunRecord) -> Source:
    """What a run record adds: its hits and writes, in order of first use (keys only compiled are left out), and the
    compile seconds it measured of the keys it compiled (moved to its group by :func:`with_source`)."""
    used = [u for u in sorted(record.keys, key=lambda u: u.first_at) if u.event != records.COMPILED]
    return Source(record.run_id, record.updated_at, [u.key for u in used],
                  {u.key: u.sha256 for u in used if u.sha256 is not None},
                  {u.key: u.compile_s for u in used if u.compiles and u.compile_s is not None})


def warmup_source(record: coverage.WarmupRecord, machine: str | None = None) -> Source:
    """What a warm-up's coverage adds: the programs it found or put there, and the compile seconds of those it wrote,
    measured on ``machine`` (records.machine_of its own run record)."""
    there = [p for p in record.programs if p.status != coverage.NOT_WRITTEN]
    return Source(record.id, record.finished_at, [p.key for p in there],
                  {p.key: p.sha256 for p in there if p.sha256 is not None},
                  {p.key: p.compile_s for p in there if p.status == coverage.WRITTEN and p.compile_s is not None},
                  machine)


def with_source(index: JobIndex, fingerprint: Fingerprint, source: Source, *, warmup: bool,
                now: float | None = None) -> JobIndex:
    """``index`` with ``source`` (a run's, or a warm-up's) in its fingerprint's group, and bounded (see the module)."""
    since = (time.time() if now is None else now) - DEFAULT_DAYS * 86400.0
    groups = [_within(g, since) for g in index.groups]
    group = next((g for g in groups if _matched(g.fingerprint) == _matched(fingerprint)), None)
    if group is None:
        group = Group(fingerprint)
        groups.append(group)
    if warmup:
        group.warmups = _newest([source, *(s for s in group.warmups if s.id != source.id)], MAX_WARMUPS)
    else:
        group.compile_s = {**source.compile_s, **group.compile_s}  # the earliest measure of a key stays
        source = Source(source.id, source.at, source.keys, source.sha256)
        group.runs = _newest([source, *(s for s in group.runs if s.id != source.id)], DEFAULT_RUNS)
    _measures_kept(group)
    # The group's fingerprint is its newest run's (a warm-up's only while it has no run), as a set reports it.
    if (group.runs[:1] == [source]) if not warmup else (not group.runs and group.warmups[:1] == [source]):
        group.fingerprint = fingerprint
    groups = [g for g in groups if g.runs or g.warmups]
    groups.sort(key=lambda g: g.newest_at, reverse=True)
    return _bounded(JobIndex(index.job, groups[:MAX_GROUPS]))


def _matched(fingerprint: Fingerprint) -> tuple[Any, ...]:
    return tuple(getattr(fingerprint, f) for f in MATCHED)


def _newest(sources: list[Source], most: int) -> list[Source]:
    return sorted(sources, key=lambda s: s.at, reverse=True)[:most]


def _bounded(index: JobIndex) -> JobIndex:
    """``index`` within :data:`MAX_INDEX_BYTES`: the oldest groups go, then the oldest sources of what is left, and
    last the latest keys of the one source left."""
    while len(encode(index)) > MAX_INDEX_BYTES:
        if len(index.groups) > 1:
            index.groups.pop()
            continue
        (group,) = index.groups
        sources = group.runs + group.warmups
        if len(sources) > 1:
            oldest = min(sources, key=lambda s: s.at)
            group.runs = [s for s in group.runs if s is not oldest]
            group.warmups = [s for s in group.warmups if s is not oldest]
            _measures_kept(group)
            continue
        (only,) = sources
        keys = only.keys[: len(only.keys) * 3 // 4]
        kept = set(keys)
        trimmed = Source(only.id, only.at, keys, {k: v for k, v in only.sha256.items() if k in kept},
                         {k: v for k, v in only.compile_s.items() if k in kept}, only.machine)
        group.runs, group.warmups = ([trimmed], []) if group.runs else ([], [trimmed])
        _measures_kept(group)
    return index


def encode(index: JobIndex) -> bytes:
    """As stored."""
    return msgspec.json.encode(index)


def update(storage: Storage, job: str, change: Callable[[JobIndex], JobIndex], *,
           attempts: int = UPDATE_ATTEMPTS) -> JobIndex:
    """Apply ``change`` to the job's index in the root, losing no other writer's update: read with its version
    (a stat, then at most :data:`MAX_INDEX_BYTES`), change, written only if still that version (created where there
    was none); read and changed again when another writer came first. An object there that is not an index is
    replaced. Returns the index as read before the change that was written (an empty one where there was none).
    Raises :class:`PreconditionFailedError` after ``attempts`` rounds lost, and storage's errors."""
    name = index_name(job)
    for attempt in range(attempts):
        if attempt:
            time.sleep(random.uniform(0, 0.1 * 2**attempt))  # writers that collided spread out
        info = storage.stat(name)
        current = JobIndex(job)
        if info is not None:
            try:
                data = storage.read_bounded(name, MAX_INDEX_BYTES, listed_bytes=info.size_bytes)
                found = None if data is None else parse(data)
                if found is not None and found.job == job:
                    current = found
            except (InvalidInputError, TooLargeError):
                pass  # not an index of this job's: this write replaces it
        try:
            if info is None:
                storage.write_atomic(name, encode(change(current)), create_only=True)
            else:
                storage.write_atomic(name, encode(change(current)), if_version=storage.version_token(info))
            return current  # with_source makes a new index: what was read is as it was
        except PreconditionFailedError:
            continue
    raise PreconditionFailedError(f"{name} in {storage.url} kept changing under {attempts} updates")


def add_run(storage: Storage, record: RunRecord) -> JobIndex | None:
    """Merge process 0's final record of a job's run into the job's index (see :func:`update`); the index as read
    before (the earlier runs' measures, :func:`measured`). The records of other processes (SPMD processes compile
    the same programs) and of warm-ups' own runs add nothing, and ask nothing (None)."""
    if record.process_index != 0 or record.kind != records.JOB:
        return None
    source = run_source(record)
    return update(storage, record.job, lambda index: with_source(index, record.fingerprint, source, warmup=False))


def add_warmup(storage: Storage, record: coverage.WarmupRecord, machine: str | None = None) -> None:
    """Merge a warm-up's coverage into the index of the job it warmed (see :func:`update`); ``machine``: where it
    compiled (records.machine_of its run record), what its hits are credited as."""
    source = warmup_source(record, machine)
    update(storage, record.job, lambda index: with_source(index, record.fingerprint, source, warmup=True))
