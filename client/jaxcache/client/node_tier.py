"""The node-local tier as a session runs it: the directory JAX reads (:mod:`jaxcache.client.local_tier`), the
write-behind uploads of what JAX writes there (:mod:`jaxcache.client.uploads`), and the start's work beside the job's
own start-up: the working set fetched and its copies checked (:mod:`jaxcache.client.prefetch`), or the job's named
pack looked at and seeded from (:mod:`jaxcache.client.pack_seed`), a small root listed once
(:mod:`jaxcache.client.copy_checks`), then the copies no job asks for checked, at most once a day each."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jaxcache import entry
from jaxcache.client import prefetch
from jaxcache.client.jax_dir import healed_text
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.local_tier import LocalTier
from jaxcache.client.options import DEFAULT_LOCAL_MAX_BYTES, ClientOptions
from jaxcache.client.prefetch import Prefetcher
from jaxcache.client.root_calls import RootCalls
from jaxcache.client.uploads import Uploader
from jaxcache.records import Fingerprint, LocalTierCounts
from jaxcache.storage import Storage
from jaxcache.working_set import Wanted

if TYPE_CHECKING:
    from jaxcache.client.pack_seed import PackSeeder

log = logging.getLogger("jaxcache.client")


class NodeTier:
    """One process's node-local tier: made at ``enable_cache``, started before anything compiles."""

    def __init__(self, directory: str, root: Callable[[], Storage], options: ClientOptions, *,
                 policy: LoadPolicy | None, refused: Callable[[str, str], None] | None,
                 writer_name: Callable[[], str], fingerprint: Callable[[], Fingerprint]) -> None:
        self.policy = policy
        #: Every request the tier (and the session's records) make to the root: bounded, none while it is silent.
        self.calls = calls = RootCalls(root, deadline_s=options.lookup_deadline_s, url=options.cache_dir)
        self.tier = LocalTier(directory, calls, policy=policy, refused=refused or (lambda _key, _why: None),
                              max_size_bytes=options.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES)
        self.uploader = Uploader(self.tier, signing_key=options.signing_key, writer_name=writer_name,
                                 signed_dir=policy is not None and policy.mode == "signed")
        self.prefetcher: Prefetcher | None = None
        self.seeder: PackSeeder | None = None
        self._started: threading.Thread | None = None
        self.healed: list[tuple[str, str]] = []  # what would have stopped JAX's writes, healed at start (JaxDir.heal)
        if options.pack is not None:
            # The pack is the job's working set: no index read, its ranged reads JAXCACHE_PREFETCH at once.
            from jaxcache.client.pack_seed import PackSeeder  # the bundle's checks: loaded only for a pack

            self.seeder = PackSeeder(self.tier, options.pack, trusted=options.trusted_keys,
                                     workers=options.prefetch or 1,
                                     max_bytes=options.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES)
            self.tier.prefetch = self.tier.pack = self.seeder
        elif options.prefetch:
            url = options.service_url
            ask = None if url is None else (lambda wanted: prefetch.from_service(
                url, options.token, options.cache_dir, options.job, wanted))
            find = prefetch.finder(options.job, lambda: Wanted.of(fingerprint()), calls, ask)
            self.prefetcher = self.tier.prefetch = Prefetcher(self.tier, find, options.prefetch)

    @property
    def directory(self) -> str:
        """The directory JAX reads."""
        return self.tier.directory

    def storage(self) -> Storage:
        """The directory as a storage root (where JAX's writes are read back)."""
        return self.tier.storage

    def start(self) -> None:
        """Drop what is known bad, resume earlier processes' uploads, answer JAX's lookups, and start the start's
        work beside the job's own start-up. No request to the root on this thread."""
        policy = self.policy
        tier = self.tier
        self.healed = tier.heal()  # before JAX writes here: one entry without its -atime fails them all
        bad = set() if policy is None else set(policy.bad)
        if policy is not None and policy.attested is not None:
            # Before JAX reads anything here: copies whose bytes are not what the service attests for their key.
            bad |= tier.unattested(policy.attested, self.uploader.pending())
        unverified = set(self.uploader.unverified())  # signed: local writes no signature of this client covers
        dropped = tier.drop(bad | unverified, self.uploader.pending())
        # Dropped here, or evicted since: their marks go too.
        self.uploader.forget_unverified([k for k in unverified if k in dropped or not os.path.exists(
            os.path.join(tier.directory, entry.cache_name(k)))])
        self.uploader.resume(self.uploader.pending())
        tier.checks.note_copies()
        tier.install()  # it judges what it fetches; a local copy loads once checked against the root
        if self.prefetcher is not None:
            self.prefetcher.start()  # off this thread: the job's own start-up runs meanwhile
        if self.seeder is not None:
            self.seeder.start()
        self._started = threading.Thread(target=self._start_work, name="jaxcache-tier-start", daemon=True)
        self._started.start()

    def _start_work(self) -> None:
        """A small root's one listing (checking every copy at once); once the working set is fetched and checked,
        the copies no job asks for."""
        checks = self.tier.checks
        try:
            if self.seeder is None:
                checks.list_small(self.uploader.pending)
            else:  # the pack vouches for its copies: a listing page would be a request more per process
                checks.listed.set()
            if self.prefetcher is not None:
                self.prefetcher.done.wait()  # each of its requests is bounded: it ends
            if self.seeder is not None:
                self.seeder.done.wait()
            checks.sweep(self.uploader.pending)
        except Exception as exc:  # noqa: BLE001 - lookups check their own copies all the same
            log.warning("jaxcache: the node-local tier's start in %s stopped: %s", self.tier.directory, exc)

    def settle(self, wait_s: float, *, final: bool = False) -> bool:
        """Wait up to ``wait_s`` for the start's work (not at exit: ``final``) and the uploads still running; whether
        all ended. At exit unfinished uploads are counted as pending."""
        deadline = time.monotonic() + wait_s
        if self._started is not None and not final:
            self._started.join(wait_s)
        return self.uploader.drain(max(0.0, deadline - time.monotonic()), final=final) and (
            final or self._started is None or not self._started.is_alive())

    def close(self, wait_s: float) -> None:
        """At exit: the uploads still running, waited for within ``wait_s`` less what the writes after them keep
        (a deadline, or half of it), not at all while the root is silent; the unfinished ones counted as pending."""
        self.settle(wait_s - min(self.calls.deadline_s, wait_s / 2), final=True)

    def counts(self) -> LocalTierCounts:
        """What the tier did so far in this process."""
        counts = self.tier.snapshot()
        ahead = self.prefetcher or self.seeder
        return counts if ahead is None else ahead.fill(counts)

    def summary(self) -> str:
        """The summary line's part about the tier."""
        c = self.counts()
        failed = c.upload_failed + c.upload_pending
        ahead = "" if self.prefetcher is None else (
            f", {c.prefetched} prefetched of a working set of {c.prefetch_wanted} ({c.prefetch_unused} unused)")
        if self.seeder is not None:
            ahead = f", {self.seeder.summary()} ({c.prefetch_unused} of its entries unused)"
        return (f"; local tier {c.directory}: {c.loaded} loaded locally{ahead}, {c.fetched} fetched on demand"
                f" ({c.fetched_s:.2f} s), {c.uploaded} uploaded" + (f", {failed} not uploaded" if failed else "")
                + (f", {c.upload_refused} not uploaded as not the bytes JAX put" if c.upload_refused else "")
                + (f"; healed at start: {healed_text(self.healed)}" if self.healed else ""))
