"""Prefetch: the job's working set fetched into the node-local tier while the job starts up, before JAX asks.

At ``enable_cache`` a daemon thread asks for the set (:mod:`jaxcache.working_set`: the keys the job's recent runs
with this fingerprint hit or wrote, and its warm-ups' coverage) from the service when the job reports to one (one
request), else from the job's index in the root (one request: :mod:`jaxcache.working_set_index`), then fetches the
keys not already local and checks the copies that are (:mod:`jaxcache.client.copy_checks`), a bounded number at a
time on daemon threads, through the tier's own checks and admission. A lookup of a key whose fetch is under way
waits for it (within its deadline); one whose fetch has not started takes it over. Keys fetched and never asked for
are counted, so the set can be judged.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_all
from typing import Any

from jaxcache import entry, working_set_index
from jaxcache.client.local_tier import PENDING_DIR, LocalTier, Pulled
from jaxcache.client.reporting import ask_service
from jaxcache.client.root_calls import RootCalls
from jaxcache.client.workers import DaemonPool
from jaxcache.errors import UnreachableError
from jaxcache.records import LocalTierCounts
from jaxcache.working_set import Wanted, WorkingSet

log = logging.getLogger("jaxcache.client")

ASK_TIMEOUT_S = 5.0  # the service's answer; past it the root's records are read instead


def from_service(service_url: str, token: str | None, cache_dir: str, job: str, wanted: Wanted) -> WorkingSet:
    """The set as the service's catalog has it (one request); raises when the service cannot answer."""
    query = {"cache_dir": cache_dir, "job": job, **wanted.as_params()}
    return WorkingSet.from_builtins(ask_service(service_url, "/v1/working-set", query, token, ASK_TIMEOUT_S))


class Prefetcher:
    """The working set's fetches for one process: started once, answered to the tier's lookups."""

    def __init__(self, tier: LocalTier, find: Callable[[], WorkingSet], workers: int) -> None:
        self._tier = tier
        self._find = find
        self._workers = workers
        self._lock = threading.Lock()
        self._fetches: dict[str, Future[Pulled]] = {}
        self._fetched: set[str] = set()
        self._asked: set[str] = set()
        self._started = time.monotonic()
        self._done_s = 0.0  # from the start until the last key was fetched
        #: The set as found (with what its hits are worth, where it came from the job's index); None until then.
        self.found: WorkingSet | None = None
        #: Set once the set's keys were fetched and its copies checked (or the set could not be found).
        self.done = threading.Event()

    def start(self) -> None:
        """Find the set and fetch it, off the caller's thread."""
        threading.Thread(target=self._run, name="jaxcache-prefetch", daemon=True).start()

    def _run(self) -> None:
        try:
            self._prefetch()
        finally:
            self.done.set()

    def _prefetch(self) -> None:
        tier = self._tier
        try:
            found = self.found = self._find()
        except UnreachableError as exc:  # the tier said so once, for everything it asks the root
            log.info("jaxcache: could not find this job's working set to prefetch (%s)", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a set that cannot be found only means fetching on demand
            log.warning("jaxcache: could not find this job's working set to prefetch (%s); the node-local tier"
                        " fetches on demand", exc)
            return
        tier.add(prefetch_wanted=len(found.keys))
        # The start's listing of a small root checks every copy in one request: the set's are checked after it.
        tier.checks.listed.wait(tier.calls.deadline_s)
        here = set(os.listdir(tier.directory))
        pending = set(os.listdir(os.path.join(tier.directory, PENDING_DIR)))
        log.debug("jaxcache: prefetching the %d keys of job %s's working set", len(found.keys), found.job)
        pool = DaemonPool(self._workers, "jaxcache-prefetch")
        work: list[Future[Any]] = []
        with self._lock:
            for key in found.keys:
                if key in self._asked or key in pending:
                    continue
                if entry.cache_name(key) in here:
                    if key in tier.checks.copies:  # else admitted or written since: the root's, or JAX's own
                        work.append(pool.submit(functools.partial(tier.checks.check, key)))  # may it load?
                else:
                    self._fetches[key] = pool.submit(functools.partial(self._fetch, key))
                    work.append(self._fetches[key])
        pool.close()
        wait_all(work)

    def _fetch(self, key: str) -> Pulled:
        pulled = self._tier.pull(key)
        if pulled.admitted and pulled.data is not None and not pulled.here:
            with self._lock:
                self._fetched.add(key)
                self._done_s = time.monotonic() - self._started
            self._tier.add(prefetched=1, prefetched_bytes=len(pulled.data))
        # JAX reads the admitted file: the bytes can go
        return Pulled(None, pulled.reason, pulled.admitted, unanswered=pulled.unanswered)

    def take(self, key: str, until: float) -> Pulled | None:
        """The fetch of ``key``: waited for when under way, until ``until`` (``time.monotonic()``); None when none
        was started (JAX's lookup fetches)."""
        with self._lock:
            self._asked.add(key)
            fetch = self._fetches.pop(key, None)
        if fetch is None or fetch.cancel():
            return None
        if not fetch.done():
            self._tier.add(prefetch_waited=1)
        try:
            return fetch.result(timeout=max(0.0, until - time.monotonic()))
        except FutureTimeout:  # its own deadline, which began before this lookup's, ends first and says so
            return Pulled(None, None, False, unanswered=True)

    def asked(self, key: str) -> None:
        """JAX loaded ``key`` locally."""
        with self._lock:
            self._asked.add(key)

    def fill(self, counts: LocalTierCounts) -> LocalTierCounts:
        """``counts`` with the seconds until the last fetch and the keys fetched that JAX has not asked for."""
        with self._lock:
            counts.prefetched_s = self._done_s
            counts.prefetch_unused = len(self._fetched - self._asked)
        return counts


def finder(job: str, wanted: Callable[[], Wanted], calls: RootCalls,
           ask: Callable[[Wanted], WorkingSet] | None) -> Callable[[], WorkingSet]:
    """How the set is found: the service's answer when it reports to one, else (or when it cannot answer) the job's
    index in the root (:mod:`jaxcache.working_set_index`: one request, within the tier's deadline). Without an index
    (the job's first run, or a root written by older clients only) the set is empty: nothing more is read."""

    def find() -> WorkingSet:
        known = wanted()
        if ask is not None:
            try:
                return ask(known)
            except Exception as exc:  # noqa: BLE001 - the root's index says the same
                log.info("jaxcache: the service could not give this job's working set (%s); reading its index in"
                         " the root", exc)
        found = calls.ask(lambda root: working_set_index.from_index(root, job, known), what="this job's working set")
        if found is None:
            log.debug("jaxcache: no working-set index for job %s in the root: nothing to prefetch", job)
            return WorkingSet(job=job)
        return found

    return find
