"""The node-local tier as a session runs it: the directory JAX reads (:mod:`jaxcache.client.local_tier`) and the
write-behind uploads of what JAX writes there (:mod:`jaxcache.client.uploads`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from jaxcache import entry
from jaxcache.client import prefetch
from jaxcache.client.jax_dir import healed_text
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.local_tier import LocalTier
from jaxcache.client.options import DEFAULT_LOCAL_MAX_BYTES, ClientOptions
from jaxcache.client.prefetch import Prefetcher
from jaxcache.client.uploads import Uploader
from jaxcache.records import Fingerprint, LocalTierCounts
from jaxcache.storage import Storage
from jaxcache.working_set import Wanted


class NodeTier:
    """One process's node-local tier: made at ``enable_cache``, started before anything compiles."""

    def __init__(self, directory: str, root: Callable[[], Storage], options: ClientOptions, *,
                 policy: LoadPolicy | None, refused: Callable[[str, str], None] | None,
                 writer_name: Callable[[], str], fingerprint: Callable[[], Fingerprint]) -> None:
        self.policy = policy
        self.tier = LocalTier(directory, root, policy=policy, refused=refused or (lambda _key, _why: None),
                              max_size_bytes=options.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES)
        self.uploader = Uploader(self.tier, root, signing_key=options.signing_key, writer_name=writer_name,
                                 signed_dir=policy is not None and policy.mode == "signed")
        self.prefetcher: Prefetcher | None = None
        self._tidy: threading.Thread | None = None
        self.healed: list[tuple[str, str]] = []  # what would have stopped JAX's writes, healed at start (JaxDir.heal)
        if options.prefetch:
            url = options.service_url
            ask = None if url is None else (lambda wanted: prefetch.from_service(
                url, options.token, options.cache_dir, options.job, wanted))
            find = prefetch.finder(options.job, lambda: Wanted.of(fingerprint()), root, ask)
            self.prefetcher = self.tier.prefetch = Prefetcher(self.tier, find, options.prefetch)

    @property
    def directory(self) -> str:
        """The directory JAX reads."""
        return self.tier.directory

    def storage(self) -> Storage:
        """The directory as a storage root (where JAX's writes are read back)."""
        return self.tier.storage

    def start(self) -> None:
        """Revalidate the local copies, resume earlier processes' uploads, then answer JAX's lookups."""
        policy = self.policy
        self.healed = self.tier.heal()  # before JAX writes here: one entry without its -atime fails them all
        bad = set() if policy is None else set(policy.bad)
        if policy is not None and policy.attested is not None:
            # Before JAX reads anything here: copies whose bytes are not what the service attests for their key.
            bad |= self.tier.unattested(policy.attested, self.uploader.pending())
        if policy is not None and policy.mode == "signed":
            # What the root signs decides what loads: its listing is read before JAX reads anything here.
            unverified = set(self.uploader.unverified())
            dropped = self.tier.revalidate(bad, pending=self.uploader.pending, need_signature=True,
                                           unverified=unverified)
            # Dropped here, or evicted since: their marks go too.
            self.uploader.forget_unverified([k for k in unverified if k in dropped or not os.path.exists(
                os.path.join(self.tier.directory, entry.cache_name(k)))])
        else:
            # What this process knows is bad goes now. Copies the root no longer has (pruned, deleted) are only
            # stale, so the root's listing (and google-cloud-storage's import) runs beside the job's start-up.
            self.tier.revalidate(bad, pending=self.uploader.pending, need_signature=False, list_root=False)
            self._tidy = threading.Thread(target=self.tier.revalidate, args=((),), daemon=True,
                                          kwargs=dict(pending=self.uploader.pending, need_signature=False),
                                          name="jaxcache-revalidate")
            self._tidy.start()
        self.uploader.resume(self.uploader.pending())
        self.tier.install()  # it judges what it fetches; a local file is loaded while its origin is the root's
        if self.prefetcher is not None:
            self.prefetcher.start()  # off this thread: the job's own start-up runs meanwhile

    def settle(self, wait_s: float, *, final: bool = False) -> bool:
        """Wait up to ``wait_s`` for the start's revalidation and the uploads still running; whether both ended.
        At exit (``final``) unfinished uploads are counted as pending."""
        deadline = time.monotonic() + wait_s
        if self._tidy is not None:
            self._tidy.join(wait_s)
        return self.uploader.drain(max(0.0, deadline - time.monotonic()), final=final) and not (
            self._tidy is not None and self._tidy.is_alive())

    def counts(self) -> LocalTierCounts:
        """What the tier did so far in this process."""
        counts = self.tier.snapshot()
        return counts if self.prefetcher is None else self.prefetcher.fill(counts)

    def summary(self) -> str:
        """The summary line's part about the tier."""
        c = self.counts()
        failed = c.upload_failed + c.upload_pending
        ahead = "" if self.prefetcher is None else (
            f", {c.prefetched} prefetched of a working set of {c.prefetch_wanted} ({c.prefetch_unused} unused)")
        return (f"; local tier {c.directory}: {c.loaded} loaded locally{ahead}, {c.fetched} fetched on demand"
                f" ({c.fetched_s:.2f} s), {c.uploaded} uploaded" + (f", {failed} not uploaded" if failed else "")
                + (f", {c.upload_refused} not uploaded as not the bytes JAX put" if c.upload_refused else "")
                + (f"; healed at start: {healed_text(self.healed)}" if self.healed else ""))
