"""``enable_cache()``: configure JAX's persistent cache the same way in every job, and watch what it does."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jaxcache import working_set_index
from jaxcache.client import claim, exit_summary
from jaxcache.client import jax_internals as ji
from jaxcache.client import trust as trust_mod
from jaxcache.client.attestation import Attestor
from jaxcache.client.jax_dir import JaxDir
from jaxcache.client.loads import LoadGuard, LoadPolicy
from jaxcache.client.misses import MAX_CHECKED, MAX_CHECKED_REMOTE, MissCauses, MissCheck
from jaxcache.client.node_tier import NodeTier
from jaxcache.client.options import ClientOptions, resolve, say_xla_caches_off
from jaxcache.client.reporting import RecordWriter, ServiceReporter
from jaxcache.client.savings import Savings, credit
from jaxcache.client.telemetry import CacheStats, Recorder
from jaxcache.client.tier_dir import open_local_dir
from jaxcache.client.written import WriteCheck
from jaxcache.records import HIT, JOB, WRITE, Fingerprint, KeyUsage, RunKind, RunRecord
from jaxcache.units import plural
from jaxcache.working_set import Measured, Wanted

if TYPE_CHECKING:  # verify mode loads it only when asked for
    from jaxcache.integrity import Verdict

log = logging.getLogger("jaxcache.client")

_lock = threading.Lock()
_session: CacheSession | None = None
ATTEST_WAIT_S = 30.0  # at exit: digests of the last entries written; bounded so exit never hangs on storage


class CacheSession:
    """One process's use of the cache: settings, telemetry, run records. Made by :func:`enable_cache`."""

    def __init__(self, options: ClientOptions, compression: str, loads: LoadPolicy | None = None,
                 writer: RecordWriter | None = None, tier_dir: str | None = None,
                 summary_to: exit_summary.Where = "auto") -> None:
        self.options = options
        self.summary_to = summary_to  # JAXCACHE_SUMMARY: where the summary goes at exit
        # What the job's earlier runs and warm-ups measured, from its working-set index: read by the exit's update
        # of the index, or once by the first summary that needs it (None: not read yet).
        self._measured: Measured | None = None
        self.compression = compression
        self.started_at = time.time()
        self.topology: str | None = None  # set by warm-up to the topology it mocks; else derived from devices
        self.kind: RunKind = JOB  # what wrote the run records: warm-up sets its own kinds, kept out of jobs' figures
        self.write_records = True  # False: no run record reaches the cache or the service (warmup --check)
        self._owner: str | None = None  # see claim_process
        self._deferred_notice_given = False
        self._writer = writer or RecordWriter(options.cache_dir)
        # verify=: JAX loads only what the mode's judge lets through; a refused key is compiled, never written.
        self._loads = LoadGuard(loads) if loads is not None else None
        self._tier = tier = None if tier_dir is None else NodeTier(
            tier_dir, self._writer.storage, options, policy=loads, writer_name=self._writer_name,
            refused=self._loads.refused if self._loads is not None else None, fingerprint=lambda: self.fingerprint)
        if tier is not None:
            self._writer.bind(tier.calls)  # the records' requests too: bounded, and none while the root is silent
        # The directory JAX reads and writes, whose reads the client answers so that nothing there can block them:
        # the tier, else a directory root (JAX reads an object store's root through a library of its own).
        self._dir: JaxDir | None = tier.tier if tier is not None else None if options.in_object_store else JaxDir(
            options.cache_dir, max_size_bytes=ji.lru_max_bytes())  # max_size_bytes, or JAX's own setting
        # A write counts once its entry is there whole: the run record's writes make the service's first writers.
        self._write_check = check = WriteCheck(tier.storage, tier.directory) if tier is not None else WriteCheck(
            self._writer.storage, None if options.in_object_store else options.cache_dir)
        self._recorder = Recorder(key_parts=options.key_parts, check_write=check,
                                  skipped=self._loads.why if self._loads is not None else None)
        self._misses = MissCheck(self._writer.stat,
                                 limit=MAX_CHECKED_REMOTE if options.in_object_store else MAX_CHECKED)
        self._attestor = Attestor(self._writer, self._recorder, signing_key=options.signing_key, broken=check.torn,
                                  writer_name=self._writer_name, entries=None if tier is None else tier.storage,
                                  after=None if tier is None else tier.uploader.submit)
        self._undo_put_hook: Callable[[], None] | None = None
        self._sampler = None
        if options.verify == "sample":
            from jaxcache.client.verify import HitSampler  # reads entries: loaded only when asked for

            self._sampler = HitSampler(self._writer.storage())
        self._reporter = ServiceReporter(options.service_url, options.token) if options.service_url else None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._closed = False
        self._flush_lock = threading.Lock()

    # -- public -------------------------------------------------------------------------------------------------

    @property
    def cache_dir(self) -> str:
        """The normalised directory JAX was configured with."""
        return self.options.cache_dir

    @property
    def job(self) -> str:
        """The job name in run records."""
        return self.options.job

    @property
    def run_id(self) -> str:
        """This run's id (``JAXCACHE_RUN_ID`` when the launcher sets one for all processes)."""
        return self.options.run_id

    @property
    def fingerprint(self) -> Fingerprint:
        """Everything besides the program that enters JAX's keys; compare two runs' with ``.differences()``.

        Device fields are filled once the backend is up (after the first compile, or ``jax.devices()``).
        """
        return ji.fingerprint(self.compression, xla_flags=self._recorder.xla_flags())

    def on_program(self, callback: Callable[[KeyUsage], None]) -> None:
        """Call ``callback(usage)`` whenever JAX finishes compiling or loading a program (warm-up progress)."""
        self._recorder.add_listener(callback)

    def claim_process(self, owner: str) -> None:
        """Make later :func:`enable_cache` calls in this process return this session, whatever they ask for.

        For a tool that runs a user's script under its own settings (``warmup --script`` runs training scripts,
        which call ``enable_cache()`` themselves): the tool's settings win, and the first such call logs which of
        the script's were overridden, naming ``owner``.
        """
        self._owner = owner

    def stats(self) -> CacheStats:
        """Hits, misses, writes, hit rate, compile, retrieval and saved seconds so far in this process (seconds saved
        as far as this process knows the hits' measures already: :meth:`summary` reads them where it needs to)."""
        saved = self._savings()
        return dataclasses.replace(self._recorder.stats(), saved_s=saved.saved_s,
                                   saved_writer_s=saved.at_writers_time_s)

    def _savings(self, *, read: bool = False) -> Savings:
        """What the hits saved (:mod:`jaxcache.client.savings`); ``read``: first read the job's index for the hits'
        measures where none was read yet and a hit has no measure of this process's own (one request, once)."""
        usages = self._recorder.usages()
        fp = self.fingerprint
        found = None if self._tier is None or self._tier.prefetcher is None else self._tier.prefetcher.found
        if self._measured is None and found is not None and found.measured is not None:
            self._measured = found.measured  # the start read the job's index already: no request more
        if read and self.kind == JOB and self._measured is None and any(
                u.hits and not (u.compiles and u.compile_s is not None) for u in usages):
            index = self._writer.read_index(self.job)
            self._measured = working_set_index.measured(index, Wanted.of(fp))
        return credit(usages, self._measured or Measured(), kind=self.kind, platform=fp.device_kind or fp.backend)

    def skipped(self) -> dict[str, str]:
        """The keys whose entries this process refused to load (``verify=``), with why: each was compiled."""
        return self._loads.skipped() if self._loads is not None else {}

    def miss_causes(self) -> MissCauses:
        """This process's misses by the causes it can tell on its own (reads the metadata of missed entries)."""
        return self._misses.causes(self.stats().misses, self._recorder.usages(), self._recorder.failed_writes())

    @property
    def local_dir(self) -> str | None:
        """The node-local directory JAX reads (None: it reads :attr:`cache_dir` directly)."""
        return self._tier.directory if self._tier else None

    def summary(self) -> str:
        """One line: what the cache did for this process, and why its misses missed as far as it can tell (a write
        counts only when its entry is there whole; the others are "compiled, not written" with why)."""
        s = self._recorder.stats()
        saved = self._savings(read=True)
        rate = "n/a" if s.hit_rate is None else f"{s.hit_rate:.0%}"
        causes = self.miss_causes().describe(self.cache_dir, self.run_id) if s.misses else ""
        return (
            f"jaxcache: job {self.job}: {plural(s.hits, 'hit')}, {plural(s.misses, 'miss')} ({s.writes} written),"
            f" hit rate {rate}; {s.compile_s:.1f} s compiling, {s.retrieval_s:.2f} s loading, {saved.words()};"
            f" cache {self.cache_dir}" + (f"; {causes}" if causes else "")
            + ("" if self._tier is None else self._tier.summary())
        )

    def record(self, *, final: bool = False) -> RunRecord:
        """This process's run record as of now."""
        usages = self._recorder.usages()
        unknown = [u.key for u in usages if u.size_bytes is None and u.event in (HIT, WRITE)]
        if unknown:
            for key, size in self._writer.sizes(unknown, None if self._tier is None else self._tier.storage()).items():
                self._recorder.set_size(key, size)
            usages = self._recorder.usages()
        index, count = ji.processes()
        fp = self.fingerprint
        topology = self.topology
        if topology is None and fp.local_device_count is not None and fp.process_count is not None:
            topology = f"1x{fp.process_count}x{fp.local_device_count}"
        return RunRecord(
            job=self.job,
            run_id=self.run_id,
            process_index=index,
            process_count=max(count, index + 1),
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self.started_at,
            updated_at=time.time(),
            fingerprint=fp,
            topology=topology,
            cache_dir=self.cache_dir,
            final=final,
            kind=self.kind,
            keys=sorted(usages, key=lambda u: u.first_at),
            local=None if self._tier is None else self._tier.counts(),
            cpus=_cpus(),
        )

    def flush(self, *, final: bool = False) -> RunRecord:
        """Write the run record now (and send it to the service when one is configured).

        In an object store the record is stored only by the final flush at exit; earlier ones only reach the service.
        """
        with self._flush_lock:
            record = self.record(final=final)
            if not self.write_records:
                return record
            if not self.options.in_object_store:
                self._writer.write(record)
            elif final:
                # Jobs' bucket identities may create objects but never overwrite them (deploy/terraform), so a
                # bucket gets one record per process, at exit; periodic updates go to the service only.
                self._writer.write(record, create_only=True)
            if final:  # process 0's: the job's working set for its next starts, in one object
                read = self._writer.index(record)
                if read is not None:  # what the job's earlier runs measured, for the summary: no request more
                    self._measured = working_set_index.measured(read, Wanted.of(record.fingerprint))
            if self._reporter is not None:
                self._reporter.submit(record.to_json())
            return record

    def close(self) -> None:
        """Final record and summary; runs at interpreter exit. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self._attestor.drain(ATTEST_WAIT_S)  # then the uploads, within their own bound
            if self._tier is not None:
                # The uploads, then the final record's writes, all within the upload bound.
                self._writer.until = time.monotonic() + self.options.upload_wait_s
                self._tier.close(self.options.upload_wait_s)
            self.check_sample()
            self.flush(final=True)
            if self._reporter is not None:
                self._reporter.drain()
            exit_summary.say(self.summary(), self.summary_to, log, job=self.kind == JOB)
        except Exception as exc:  # noqa: BLE001 - never turn a clean exit into a crash
            log.warning("jaxcache: could not write the final run record: %s", exc)

    # -- internals ----------------------------------------------------------------------------------------------

    def _start(self) -> None:
        self._recorder.install()
        self._undo_put_hook = ji.hook_cache_puts(self._on_put)
        if self._undo_put_hook is None:
            ji.degraded("has no compilation_cache._get_cache: entries this process writes stay unattested and unsigned")
        self._recorder.add_listener(self._attest_writes)
        self._ticker = threading.Thread(target=self._tick, name="jaxcache-records", daemon=True)
        self._ticker.start()
        atexit.register(self.close)
        if self._tier is not None:
            self._tier.start()  # the tier judges what it fetches (instead of the read hook)
            return
        if self._dir is not None:
            self._dir.install()  # first: the verify judge, installed next, wraps it and judges what it reads
        if self._loads is not None:
            self._loads.install()

    def _writer_name(self) -> str:
        return f"{self.kind} {self.job} run {self.run_id}"

    def _on_put(self, key: str, value: bytes) -> None:
        if self._dir is not None:
            try:
                self._dir.heal()  # what JAX's eviction, inside this write, would stop on
            except Exception as exc:  # noqa: BLE001 - JAX writes, or says why it could not, all the same
                log.warning("jaxcache: could not check %s before JAX's write there: %s", self._dir.directory, exc)
        self._write_check.before_put(key)
        sha256, size = self._attestor.on_put(key, value)
        if self._tier is not None:
            self._tier.uploader.on_put(key, sha256, size)  # signed and marked pending before JAX stores it

    def _claimed_call(self, asked: dict[str, object]) -> CacheSession:
        """A later enable_cache() call in a process this session claimed: this session, and one notice."""
        assert self._owner is not None
        with _lock:
            first, self._deferred_notice_given = not self._deferred_notice_given, True
        if first:
            level, text = claim.notice(self.options, self._owner, asked)
            log.log(level, "%s", text)
        return self

    def _attest_writes(self, usage: KeyUsage) -> None:
        if usage.event == WRITE and usage.sha256 is None:
            self._attestor.submit(usage.key, usage.first_at)
        elif usage.event == HIT and self._sampler is not None:
            self._sampler.on_hit(usage.key)

    @property
    def integrity_findings(self) -> list[Verdict]:
        """With ``verify="sample"``: the entries this job hit that failed the check (tampered or mismatched)."""
        return [] if self._sampler is None else list(self._sampler.findings)

    def check_sample(self, timeout_s: float = ATTEST_WAIT_S) -> list[Verdict]:
        """With ``verify="sample"``: check the hits collected so far now (if not yet), wait, return findings."""
        if self._sampler is not None:
            self._sampler.start()
            self._sampler.wait(timeout_s)
        return self.integrity_findings

    def wait_for_attestations(self, timeout_s: float = ATTEST_WAIT_S) -> bool:
        """Wait (bounded) for every write's digest and upload, and for the node-local tier's start; False on timeout."""
        deadline = time.monotonic() + timeout_s
        done = self._attestor.drain(timeout_s)
        return (self._tier is None or self._tier.settle(max(0.0, deadline - time.monotonic()))) and done

    def _tick(self) -> None:
        while not self._stop.wait(self.options.record_every_s):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001
                log.warning("jaxcache: periodic run record failed: %s", exc)

    def _shutdown_for_tests(self) -> None:
        if self._loads is not None:
            self._loads.uninstall()
        if self._dir is not None:
            self._dir.uninstall()
        self._stop.set()
        self._recorder.uninstall()
        if self._undo_put_hook is not None:
            self._undo_put_hook()
        atexit.unregister(self.close)


def enable_cache(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    job: str | None = None,
    min_compile_time_secs: float | None = None,
    min_entry_size_bytes: int | None = None,
    xla_caches: str | None = None,
    max_size_bytes: int | None = None,
    service_url: str | None = None,
    token: str | None = None,
    trust: str = "strict",
    verify: str | None = None,
    local_dir: str | os.PathLike[str] | None = None,
    pack: str | None = None,
) -> CacheSession:
    """Point JAX's persistent compilation cache at ``cache_dir`` and start counting what it does.

    Call it before anything compiles (the first ``jax.jit`` call or array operation).

    Args:
        cache_dir: a directory (local or NFS), or a prefix in an object store: ``gs://bucket/prefix``,
            ``s3://bucket/prefix`` or ``az://container/prefix``; else ``JAXCACHE_DIR``, else
            ``JAX_COMPILATION_CACHE_DIR``.
        job: the job name in run records (``JAXCACHE_JOB``; default: the script's name).
        min_compile_time_secs: store only programs that took at least this long to compile
            (``JAXCACHE_MIN_COMPILE_TIME_S``; unset keeps JAX's default, 1 s).
        min_entry_size_bytes: store only entries at least this big (``JAXCACHE_MIN_ENTRY_SIZE_BYTES``; -1: no
            limit; unset keeps JAX's default).
        xla_caches: ``jax_persistent_cache_enable_xla_caches``. Default ``"none"`` on jax < 0.11, where the
            XLA autotune-cache path enters keys and a cache mounted elsewhere would never hit; JAX's default on
            later versions. ``"none"`` for object-store roots read without a node-local tier (anything else is
            refused there): XLA's C++ layer would be handed a bucket's path it cannot write.
        max_size_bytes: turn on JAX's own LRU eviction at this size: on the node-local tier when there is one
            (default 16 GiB there), else on a local root (refused for an object store without a local tier).
        service_url: the jaxcache service (``JAXCACHE_SERVICE_URL``) to send run records to, fail-open.
        token: a bearer token with the ``report`` scope (``JAXCACHE_TOKEN``).
        trust: ``"strict"`` refuses a directory others can write; ``"warn"`` logs; ``"off"`` skips the check.
        verify: ``"off"`` (default; ``JAXCACHE_VERIFY``), ``"signed"`` (JAX loads only entries a key of
            ``JAXCACHE_TRUSTED_KEYS`` signed: it compiles the others), ``"attested"`` (JAX loads no entry the
            service judged bad: it compiles those), or ``"sample"`` (check the first entries this job hits, and
            warn).
        local_dir: the node-local tier JAX reads, kept in step with ``cache_dir`` (``JAXCACHE_LOCAL_DIR``; "off":
            none). Default for object-store roots: under ``$XDG_CACHE_HOME/jaxcache/local`` (user guide); none for
            local ones.
        pack: a pack in the root (``JAXCACHE_PACK``; ``jaxcache bundle export --pack``, ``warmup --pack``) that
            seeds the node-local tier at start in a few large reads, and whose copies load while it is unchanged:
            the job's working set then (user guide, "Packs").

    Returns:
        The process's :class:`CacheSession`; a second call with the same settings returns the same one, and
        so does any call once a tool that runs this script claimed its session (``warmup --script``).

    Raises:
        CacheNotConfiguredError: no directory anywhere.
        CacheAlreadyInitializedError: JAX compiled before this call, or it was called with other settings.
        UntrustedCacheDirError: in strict mode, the directory (or a parent) can be written by others.
        IntegrityCheckError: with ``verify="attested"``, the service refuses the token, URL or cache_dir.
        VerifyUnavailableError: ``verify="signed"`` or ``"attested"`` with a JAX whose loads cannot be judged.
        InvalidInputError: a malformed argument or variable.
    """
    global _session
    with _lock:
        claimed = _session if _session is not None and _session._owner is not None else None
    if claimed is not None:
        # Before resolving: the script's settings do not apply, so they need not resolve here (a bare
        # enable_cache() relying on a JAXCACHE_DIR that only the training nodes set must not fail).
        return claimed._claimed_call({
            "cache_dir": cache_dir, "job": job, "min_compile_time_secs": min_compile_time_secs,
            "min_entry_size_bytes": min_entry_size_bytes, "xla_caches": xla_caches, "max_size_bytes": max_size_bytes,
            "service_url": service_url, "token": token, "trust": trust, "verify": verify, "local_dir": local_dir,
            "pack": pack,
        })
    options = resolve(
        cache_dir,
        job=job,
        min_compile_time_secs=min_compile_time_secs,
        min_entry_size_bytes=min_entry_size_bytes,
        xla_caches=xla_caches,
        max_size_bytes=max_size_bytes,
        service_url=service_url,
        token=token,
        trust=trust,
        default_xla_caches=ji.default_xla_caches(),
        verify=verify,
        local_dir=local_dir,
        pack=pack,
    )
    summary_to = exit_summary.where(os.environ)
    with _lock:
        if _session is not None:
            return _same_session(_session, options)
        ji.check_not_compiled(options.cache_dir)  # the first thing: a refused call changes nothing
        compression = ji.compression_library()
        # Judged as named (links unresolved), then JAX reads where it leads (options.cache_dir).
        trust_mod.check(options.cache_dir_spelled or options.cache_dir, mode=options.trust,
                        in_object_store=options.in_object_store)
        loads = None
        writer = RecordWriter(options.cache_dir)  # its root (opened when first used) is the signed judge's too
        if options.verify != "off":
            from jaxcache.client.verify import load_policy  # asks the service: loaded only when asked for

            loads = load_policy(options, writer.storage)
        say_xla_caches_off(options, tier_dir := open_local_dir(options, loads))
        ji.apply(options.jax_settings(tier_dir))
        session = CacheSession(options, compression, loads, writer, tier_dir, summary_to)
        session._start()
        _session = session
        log.debug("jaxcache: cache at %s for job %s (run %s)", options.cache_dir, options.job, options.run_id)
        return session


def _cpus() -> int | None:
    """The CPUs this process may run on (its affinity where the system says it), which XLA compiles on."""
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):  # not on every system
        return os.cpu_count()


def current_session() -> CacheSession | None:
    """The session :func:`enable_cache` made in this process, if any."""
    return _session


def _same_session(session: CacheSession, options: ClientOptions) -> CacheSession:
    claim.check_same(session.options, options)
    return session
