"""Prefetch: the job's working set fetched into the node-local tier while the job starts up, before JAX asks.

At ``enable_cache`` a daemon thread asks for the set (:mod:`jaxcache.working_set`: the keys the job's recent runs
with this fingerprint hit or wrote, and its warm-ups' coverage) from the service when the job reports to one (one
request), else from the root's records, then fetches the keys not already local, a bounded number at a time,
through the tier's own checks and admission. A lookup of a key whose fetch is under way waits for it; one whose
fetch has not started takes it over. Keys fetched and never asked for are counted, so the set can be judged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from jaxcache import entry, working_set
from jaxcache.client.local_tier import LocalTier, Pulled
from jaxcache.client.reporting import ask_service
from jaxcache.records import LocalTierCounts
from jaxcache.storage import Storage
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

    def start(self) -> None:
        """Find the set and fetch it, off the caller's thread."""
        threading.Thread(target=self._run, name="jaxcache-prefetch", daemon=True).start()

    def _run(self) -> None:
        try:
            found = self._find()
        except Exception as exc:  # noqa: BLE001 - a set that cannot be found only means fetching on demand
            log.warning("jaxcache: could not find this job's working set to prefetch (%s); the node-local tier"
                        " fetches on demand", exc)
            return
        here = set(os.listdir(self._tier.directory))
        keys = [k for k in found.keys if entry.cache_name(k) not in here]
        self._tier.add(prefetch_wanted=len(found.keys))
        log.debug("jaxcache: prefetching %d of the %d keys of job %s's working set", len(keys), len(found.keys),
                  found.job)
        pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="jaxcache-prefetch")
        with self._lock:
            for key in keys:
                if key not in self._asked:
                    self._fetches[key] = pool.submit(self._fetch, key)
        pool.shutdown(wait=False)

    def _fetch(self, key: str) -> Pulled:
        pulled = self._tier.pull(key)
        if pulled.admitted and pulled.data is not None and not pulled.here:
            with self._lock:
                self._fetched.add(key)
                self._done_s = time.monotonic() - self._started
            self._tier.add(prefetched=1, prefetched_bytes=len(pulled.data))
        return Pulled(None, pulled.reason, pulled.admitted)  # JAX reads the admitted file: the bytes can go

    def take(self, key: str) -> Pulled | None:
        """The fetch of ``key``: waited for when under way; None when none was started (JAX's lookup fetches)."""
        with self._lock:
            self._asked.add(key)
            fetch = self._fetches.pop(key, None)
        if fetch is None or fetch.cancel():
            return None
        if not fetch.done():
            self._tier.add(prefetch_waited=1)
        return fetch.result()

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


def finder(job: str, wanted: Callable[[], Wanted], root: Callable[[], Storage],
           ask: Callable[[Wanted], WorkingSet] | None) -> Callable[[], WorkingSet]:
    """How the set is found: the service's answer when it reports to one, else (or when it cannot answer) the
    root's records."""

    def find() -> WorkingSet:
        known = wanted()
        if ask is not None:
            try:
                return ask(known)
            except Exception as exc:  # noqa: BLE001 - the root's records say the same, only slower
                log.info("jaxcache: the service could not give this job's working set (%s); reading the root's"
                         " records", exc)
        return working_set.from_root(root(), job, known)

    return find
