"""The node-local tier's requests to the shared root, bounded so that a store which stops answering costs a job
seconds, not minutes.

Each store's library bounds one request and then retries it (minutes on a store that accepts connections and never
answers, or refuses them). A lookup waits for the root at most ``JAXCACHE_LOOKUP_DEADLINE_S`` (:meth:`RootCalls.ask`,
through :func:`jaxcache.storage.deadline.within`): past it JAX compiles, one warning says so, and the tier takes the
root as not answering: later lookups, the prefetch, uploads and the exit's writes skip it at once, so a job loses
about one deadline, not one per program. Jobs run for days, and a store comes back: once :data:`PROBE_AFTER_S` have
passed, the next request that wants the root starts one probe (a stat, on its own thread, within the deadline) and
skips the root meanwhile; the probe's answer lets the tier ask the root again, and no answer waits as long again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from jaxcache.client.options import DEFAULT_LOOKUP_DEADLINE_S
from jaxcache.client.workers import DaemonPool
from jaxcache.errors import UnreachableError
from jaxcache.records import RECORDS_DIR
from jaxcache.storage import Storage
from jaxcache.storage.deadline import within

log = logging.getLogger("jaxcache.client")

T = TypeVar("T")

#: How long the tier leaves a root that did not answer before one probe asks it again: a minute of a job that runs
#: for hours, and one request a minute per node while a fleet's store is down.
PROBE_AFTER_S = 60.0
PROBE_NAME = f"{RECORDS_DIR}/probe"  # stat'ed, never written: any answer (none there, too) is an answer


class RootCalls:
    """The shared root as the node-local tier asks it: within a deadline, and not at all while it is not answering.
    Thread-safe."""

    def __init__(self, open_root: Callable[[], Storage], *, deadline_s: float = DEFAULT_LOOKUP_DEADLINE_S,
                 url: str = "the shared root") -> None:
        self._open = open_root
        self.deadline_s = deadline_s
        self.url = url
        self._lock = threading.Lock()
        self._silent_at: float | None = None  # time.monotonic() when the root last let a deadline pass; None: answers
        self._probing = False
        self._answered: list[Callable[[], None]] = []
        self._silenced: list[Callable[[], None]] = []
        self._warned = False
        #: Set while the root is taken as not answering (waits elsewhere stop at it: the exit's for uploads).
        self.silent = threading.Event()
        # Where a bounded call runs at interpreter exit, where Python >= 3.12 starts no thread (the final record's).
        self._at_exit = DaemonPool(1, "jaxcache-exit-call")
        self._at_exit.start()

    def until(self) -> float:
        """The end of a deadline starting now (``time.monotonic()``): a lookup's, for all the root's answers it waits
        for."""
        return time.monotonic() + self.deadline_s

    @property
    def answering(self) -> bool:
        """False while the root is taken as not answering."""
        return not self.silent.is_set()

    def on_answer(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the probe's thread) each time the root answers again after it had not."""
        with self._lock:
            self._answered.append(callback)

    def on_silent(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` each time the root is taken as not answering (on the thread that found it so)."""
        with self._lock:
            self._silenced.append(callback)

    def ask(self, call: Callable[[Storage], T], *, what: str, until: float | None = None) -> T:
        """``call(root)``'s answer if it comes before ``until`` (default: a deadline from now), else
        :class:`UnreachableError`: then the root is taken as not answering. Raises it at once while the root is taken
        so; ``call``'s own errors pass through."""
        self._skip_if_silent()
        left = (self.until() if until is None else until) - time.monotonic()
        if left <= 0:  # spent waiting for something else of the root's (another process's download)
            raise UnreachableError(f"{self.url} did not answer {what} in time")
        try:
            try:
                return within(left, lambda: call(self._open()), what=f"{self.url} ({what})")
            except RuntimeError as exc:
                if "shutdown" not in str(exc):
                    raise
            # At interpreter exit: on the thread started for it, waited for as long.
            try:
                return self._at_exit.submit(lambda: call(self._open())).result(timeout=left)
            except FutureTimeout:
                raise UnreachableError(f"{self.url} ({what}) did not answer within {left:g} s") from None
        except UnreachableError as exc:
            self.trip(exc)
            raise

    def send(self, call: Callable[[Storage], T]) -> T:
        """``call(root)`` on this thread, bounded only by the store library's own timeouts (an upload of any size);
        :class:`UnreachableError` at once while the root is taken as not answering."""
        self._skip_if_silent()
        return call(self._open())

    def trip(self, why: BaseException | str) -> None:
        """Take the root as not answering from now on (until a probe finds it answering); one warning a process."""
        with self._lock:
            first = not self.silent.is_set()
            self._silent_at = time.monotonic()
            self.silent.set()
            warned, self._warned = self._warned, True
            callbacks = list(self._silenced) if first else []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - a callback's trouble is its own
                log.debug("jaxcache: after %s stopped answering: %s", self.url, exc)
        if first and not warned:
            log.warning("jaxcache: %s; JAX compiles what it cannot load, and the node-local tier stops asking %s"
                        " (it tries again in %.0f s; uploads wait in the tier for the root to answer, or for the"
                        " node's next job). A store that answers slowly: raise JAXCACHE_LOOKUP_DEADLINE_S (now %g s)",
                        why, self.url, PROBE_AFTER_S, self.deadline_s)
        elif first:
            log.info("jaxcache: %s; the node-local tier stops asking %s again", why, self.url)

    def _skip_if_silent(self) -> None:
        if not self.silent.is_set():
            return
        with self._lock:
            due = (self._silent_at is not None and not self._probing
                   and time.monotonic() - self._silent_at >= PROBE_AFTER_S)
            if due:
                self._probing = True
        if due:
            try:
                threading.Thread(target=self._probe, name="jaxcache-probe", daemon=True).start()
            except RuntimeError:  # at interpreter exit Python >= 3.12 starts no threads: no probe then
                with self._lock:
                    self._probing = False
        raise UnreachableError(f"{self.url} did not answer lately; not asked")

    def _probe(self) -> None:
        try:
            within(self.deadline_s, lambda: self._open().stat(PROBE_NAME), what=f"{self.url} (a probe)")
        except Exception as exc:  # noqa: BLE001 - still not answering (or not usefully): wait as long again
            with self._lock:
                self._silent_at, self._probing = time.monotonic(), False
            log.debug("jaxcache: %s still does not answer: %s", self.url, exc)
            return
        with self._lock:
            self._silent_at, self._probing = None, False
            self.silent.clear()
            callbacks = list(self._answered)
        log.warning("jaxcache: %s answers again; the node-local tier asks it again", self.url)
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:  # noqa: BLE001 - a callback's trouble is its own
                log.debug("jaxcache: after %s answered again: %s", self.url, exc)
