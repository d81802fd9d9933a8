"""Hits, misses, writes and seconds, per key, from ``jax.monitoring`` events and JAX's cache log records.

Events give counts and durations; only the log records carry keys. Both fire on the compiling thread in a fixed
order per lookup (docs/jax-internals.md, "Telemetry"), so the key named last on a thread is the one the following
events belong to. Nothing here runs per training step: JAX emits these only when it compiles or loads a program.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from jax import monitoring

from jaxcache import records, skips
from jaxcache.client import jax_internals as ji
from jaxcache.client.keycapture import KeyCapture
from jaxcache.client.logtap import LogTap
from jaxcache.records import KeyUsage

_MAX_REASON = 1000  # what a run record's reason may hold (records.Text): longer, the service refuses the record


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What the persistent cache did for this process so far."""

    hits: int
    misses: int  # programs compiled because the cache did not have them
    writes: int
    compile_s: float  # seconds spent compiling the misses (measured, not JAX's whole seconds)
    retrieval_s: float  # seconds spent reading and loading hits
    #: Compile seconds the hits saved: each hit credited with its program's compile seconds as measured on this
    #: platform where known, else the writer's time (jaxcache.client.savings); the recorder's own is JAX's figure,
    #: its stored whole seconds less loading.
    saved_s: float
    #: Lookups JAX made whose key jaxcache could not tell (none of JAX's log records that name keys came): this
    #: JAX moved what jaxcache reads, and per-key telemetry is missing for them.
    unrecognised: int = 0
    #: Programs JAX said it was writing whose entry is not there whole afterwards (a full disk, a refused write):
    #: compiled, not written, and not in ``writes``.
    failed_writes: int = 0
    #: Of ``saved_s``, the seconds credited at the writer's time (no compile of the key measured on this platform).
    saved_writer_s: float = 0.0

    @property
    def requests(self) -> int:
        """Programs JAX looked up in the cache."""
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None before anything was looked up."""
        return self.hits / self.requests if self.requests else None


class Recorder:
    """Collects what JAX reports about its cache. :meth:`install` once; :meth:`uninstall` restores everything.

    ``key_parts``: also capture what went into each key (:mod:`jaxcache.client.keycapture`). ``check_write``:
    ``check_write(key, looked_up_at)`` says why the entry JAX just wrote is not there whole (None: it is); with it a
    write counts only once the check passes (:mod:`jaxcache.client.written`), without it JAX's word is taken.
    ``skipped(key)``: why this process refused to load the key's entry (:mod:`jaxcache.client.loads`), else None;
    such a key is compiled, never written (JAX writes nothing over the entry it was refused), whatever JAX says.
    """

    def __init__(self, *, key_parts: bool = True, check_write: Callable[[str, float], str | None] | None = None,
                 skipped: Callable[[str], str | None] | None = None) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._keys: dict[str, KeyUsage] = {}
        self._requests = 0
        self._hits = 0
        self._writes = 0
        self._compile_s = 0.0
        self._retrieval_s = 0.0
        self._saved_s = 0.0
        self._unrecognised = 0
        self._check_write = check_write
        self._skipped = skipped
        self._failed: dict[str, str] = {}  # key -> why the entry JAX wrote is not there whole
        self._taps: list[tuple[logging.Logger, LogTap, int]] = []
        self._installed = False
        self._listeners: list[Callable[[KeyUsage], None]] = []
        self._capture = KeyCapture() if key_parts else None
        self._unhook: Callable[[], None] | None = None

    def add_listener(self, callback: Callable[[KeyUsage], None]) -> None:
        """Call ``callback`` with a copy of a key's usage each time JAX finishes compiling or loading it."""
        self._listeners.append(callback)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def install(self) -> None:
        """Register the event listeners and tap JAX's cache loggers."""
        if self._installed:
            return
        monitoring.register_event_listener(self._on_event)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        readers: list[tuple[str, Callable[[logging.LogRecord], None]]] = [(n, self.on_log) for n in ji.LOGGERS]
        if self._capture is not None:
            # At DEBUG this logger makes JAX hash each part of a key twice: a cost per compile, not per step.
            readers.append((ji.KEY_LOGGER, self._capture.on_log))
            self._unhook = ji.hook_cache_keys(self._capture.on_key)
            if self._unhook is None:
                ji.less_detail("has no compilation_cache.get_cache_key to hook: run records will not carry the"
                               " programs' signatures")
        for name, reader in readers:
            logger = logging.getLogger(name)
            # The records we need are DEBUG; what the user would have seen before still passes, nothing more.
            tap = LogTap(reader, passthrough_level=logger.getEffectiveLevel())
            logger.addFilter(tap)
            self._taps.append((logger, tap, logger.level))
            if logger.getEffectiveLevel() > logging.DEBUG:
                logger.setLevel(logging.DEBUG)
        self._installed = True

    def uninstall(self) -> None:
        """Undo :meth:`install` (tests and re-configuration)."""
        if not self._installed:
            return
        for unregister, callback in (
            (getattr(monitoring, "unregister_event_listener", None), self._on_event),
            (getattr(monitoring, "unregister_event_duration_listener", None), self._on_duration),
        ):
            if unregister is not None:
                try:
                    unregister(callback)
                except (AssertionError, ValueError):
                    pass
        for logger, tap, level in self._taps:
            logger.removeFilter(tap)
            logger.setLevel(level)
        self._taps.clear()
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        self._installed = False

    # -- results ------------------------------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        """Totals so far."""
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=max(self._requests - self._hits, 0),
                writes=self._writes,
                compile_s=self._compile_s,
                retrieval_s=self._retrieval_s,
                saved_s=self._saved_s,
                unrecognised=self._unrecognised,
                failed_writes=len(self._failed),
                saved_writer_s=self._saved_s,  # JAX's figure is the writer's stored seconds
            )

    def xla_flags(self) -> tuple[str, ...] | None:
        """The XLA flags JAX hashed into the last key it computed; None before that, or without key parts."""
        return None if self._capture is None else self._capture.xla_flags

    def failed_writes(self) -> dict[str, str]:
        """The keys JAX said it wrote whose entry was not there whole afterwards, with why."""
        with self._lock:
            return dict(self._failed)

    def usages(self) -> list[KeyUsage]:
        """A copy of the per-key records so far."""
        with self._lock:
            found = [_copy(u) for u in self._keys.values()]
        for usage in found:
            why = self._skipped(usage.key) if self._skipped is not None and usage.compiles else None
            if why is not None:  # the skip is why it missed, whatever JAX said about writing it afterwards
                usage.event, usage.reason, usage.writes = records.COMPILED, skips.reason(why), 0
        return found

    def set_digest(self, key: str, sha256: str, size_bytes: int) -> None:
        """Record the digest of an entry this process wrote (see :mod:`jaxcache.client.attestation`)."""
        with self._lock:
            if key in self._keys:
                self._keys[key].sha256 = sha256
                self._keys[key].size_bytes = size_bytes

    def mark_not_written(self, key: str, reason: str) -> None:
        """JAX said it wrote ``key`` but did not (the entry there is older than the lookup, or torn when read back
        whole)."""
        reason = reason[:_MAX_REASON]
        with self._lock:
            usage = self._keys.get(key)
            if usage is not None and usage.event == records.WRITE:
                usage.event, usage.reason, usage.writes = records.COMPILED, reason, max(usage.writes - 1, 0)
                self._writes = max(self._writes - 1, 0)
                self._failed[key] = reason

    def set_size(self, key: str, size_bytes: int) -> None:
        """Remember an entry's size once it has been looked up."""
        with self._lock:
            if key in self._keys:
                self._keys[key].size_bytes = size_bytes

    # -- JAX callbacks: never raise into JAX --------------------------------------------------------------------

    def _on_event(self, event: str, **_: object) -> None:
        if not event.startswith("/jax/compilation_cache/"):
            return
        with self._lock:
            if event == ji.REQUESTS:
                self._requests += 1
                self._local.awaiting_key = True  # the hit or miss record that names the key comes next
            elif event == ji.HITS:
                self._hits += 1
            elif event == ji.WRITES:
                if self._check_write is None:
                    self._writes += 1
                else:  # JAX fires it before writing: counted once the entry is found whole (_settle_write)
                    self._local.write_events = getattr(self._local, "write_events", 0) + 1

    def _on_duration(self, event: str, duration_secs: float, **_: object) -> None:
        if event not in (ji.SAVED, ji.RETRIEVAL, ji.COMPILE):
            return
        if event == ji.COMPILE:
            self._settle_write()  # JAX's compile-or-load is over, and with it any write it made
        if event == ji.COMPILE and getattr(self._local, "awaiting_key", False):
            self._unrecognised_lookup()
        usage: KeyUsage | None = getattr(self._local, "current", None)
        finished: KeyUsage | None = None
        with self._lock:
            if event == ji.SAVED:
                saved = max(float(duration_secs), 0.0)
                self._saved_s += saved
                if usage is not None:
                    usage.saved_s += saved
            elif event == ji.RETRIEVAL:
                self._retrieval_s += float(duration_secs)
                if usage is not None:
                    usage.retrieval_s += float(duration_secs)
            elif usage is not None:  # the compile-or-load of the current key is over
                if usage.event != records.HIT and getattr(self._local, "compile_s", None) is None:
                    self._note_compile(usage, float(duration_secs))
                self._local.current = None
                finished = _copy(usage) if self._listeners else None
        if event == ji.COMPILE and usage is not None and finished is not None:
            for callback in self._listeners:
                try:
                    callback(finished)
                except Exception:  # noqa: BLE001 - a listener's bug must not break a compile
                    logging.getLogger("jaxcache.client").exception("jaxcache: a program listener failed")

    def on_log(self, record: logging.LogRecord) -> None:
        """Read one record of JAX's cache loggers (called by the tap)."""
        msg = record.msg if isinstance(record.msg, str) else ""
        args: tuple[Any, ...] = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith(ji.HIT_MSG.prefix) and len(args) == 2:
            self._begin(str(args[1]), str(args[0]), hit=True)
        elif msg.startswith(ji.MISS_MSG.prefix) and len(args) == 2:
            self._begin(str(args[1]), str(args[0]), hit=False)
        elif msg.startswith(ji.WRITE_MSG.prefix) and len(args) == 2:
            if self._check_write is None:
                self._update(str(args[1]), event=records.WRITE, reason=None, writes=1)
            else:  # logged before JAX writes: a write only once its entry is there whole (_settle_write)
                self._local.pending_write = str(args[1])
        elif msg.startswith(ji.TOOK_MSG.prefix) and len(args) == 3:
            self._compiled(float(args[2]), reason=None)
        elif msg.startswith(ji.FAST_MSG.prefix) and len(args) == 3:
            self._compiled(
                float(args[2]),
                reason=f"compiled in {float(args[2]):.2f} s, under jax_persistent_cache_min_compile_time_secs"
                f"={float(args[1]):g}",
            )
        elif msg.startswith(ji.CALLBACK_MSG.prefix):
            self._reason("uses host callbacks (jax.debug.print, callbacks): JAX does not cache it")
        elif msg.startswith(ji.NOT_P0_MSG.prefix):
            self._reason("only process 0 writes the cache")
        elif msg.startswith(ji.SMALL_MSG.prefix) and len(args) == 3:
            self._update(
                str(args[0]),
                event=records.COMPILED,
                reason=f"entry of {args[1]} bytes, under jax_persistent_cache_min_entry_size_bytes={args[2]}",
                size_bytes=int(args[1]),
            )
        elif msg.startswith(ji.DISABLED_MSG.prefix) and args:
            self._update(str(args[0]), event=records.COMPILED, reason="the persistent cache is disabled")

    # -- helpers ------------------------------------------------------------------------------------------------

    def _unrecognised_lookup(self) -> None:
        self._local.awaiting_key = False
        with self._lock:
            self._unrecognised += 1
        ji.degraded("looked a program up in its persistent cache, but logged none of the records that name its key"
                    " in the way jaxcache reads them, so jaxcache could not tell which program hit or missed")

    def _begin(self, key: str, function: str, *, hit: bool) -> None:
        self._settle_write()  # a write whose compile event never came: long finished by this next lookup
        now = time.time()
        parts, program = self._capture.take(key) if self._capture is not None else (None, None)
        if self._capture is not None and parts is None:
            ji.less_detail("did not log the parts of a cache key as jaxcache reads them: run records say which"
                           " programs missed, but not which part of their key changed")
        with self._lock:
            usage = self._keys.get(key)
            if usage is None:
                usage = KeyUsage(key=key, event=records.HIT if hit else records.COMPILED, function=function,
                                 first_at=now)
                self._keys[key] = usage
            usage.last_at = now
            usage.parts = usage.parts or parts
            usage.program = usage.program or program
            if hit:
                usage.hits += 1
            else:
                usage.compiles += 1
                if usage.event == records.HIT:
                    usage.event = records.COMPILED
        self._local.current = usage
        self._local.compile_s = None
        self._local.awaiting_key = False

    def _settle_write(self) -> None:
        """Count the write JAX made on this thread if its entry is there whole, else record why not. Runs on the
        compiling thread once JAX returned, so the write is over; reads storage, so outside the lock."""
        key: str | None = getattr(self._local, "pending_write", None)
        events: int = getattr(self._local, "write_events", 0)
        if key is None and not events:
            return
        self._local.pending_write, self._local.write_events = None, 0
        if key is not None and self._skipped is not None and self._skipped(key) is not None:
            return  # JAX refused this key's entry: its put found the file there and wrote nothing
        if key is None or self._check_write is None:
            with self._lock:  # a write event without a key this JAX named as jaxcache reads it: nothing to check
                self._writes += events
            return
        with self._lock:
            usage = self._keys.get(key)
            looked_up_at = usage.last_at if usage is not None else 0.0
        try:
            reason = self._check_write(key, looked_up_at)
        except Exception as exc:  # noqa: BLE001 - never raise into JAX; an unchecked write is no claim
            reason = f"could not be read back: {exc}"
        if reason is None:
            with self._lock:
                self._writes += 1
                self._failed.pop(key, None)
            self._update(key, event=records.WRITE, reason=None, writes=1)
            return
        reason = reason[:_MAX_REASON]
        with self._lock:
            self._failed[key] = reason
        self._update(key, event=records.COMPILED, reason=reason)

    def _compiled(self, compile_s: float, reason: str | None) -> None:
        usage: KeyUsage | None = getattr(self._local, "current", None)
        with self._lock:
            if usage is None:
                self._compile_s += compile_s
                return
            self._note_compile(usage, compile_s)
            if reason is not None and usage.event != records.WRITE:
                usage.reason = reason
        self._local.compile_s = compile_s

    def _note_compile(self, usage: KeyUsage, compile_s: float) -> None:
        # Called with the lock held. Keeps the slowest measurement when a process compiles a key twice.
        self._compile_s += compile_s
        usage.compile_s = max(usage.compile_s or 0.0, compile_s)

    def _reason(self, reason: str) -> None:
        usage: KeyUsage | None = getattr(self._local, "current", None)
        if usage is not None:
            with self._lock:
                if usage.event != records.WRITE:
                    usage.reason = reason

    def _update(self, key: str, *, event: records.Event, reason: str | None, writes: int = 0,
                size_bytes: int | None = None) -> None:
        with self._lock:
            usage = self._keys.get(key)
            if usage is None:
                usage = KeyUsage(key=key, event=event, function=key.rsplit("-", 1)[0], first_at=time.time())
                self._keys[key] = usage
            if event == records.WRITE or usage.event != records.WRITE:
                usage.event = event
                usage.reason = reason
            usage.writes += writes
            if size_bytes is not None:
                usage.size_bytes = size_bytes


def _copy(usage: KeyUsage) -> KeyUsage:
    return msgspec.structs.replace(usage)
