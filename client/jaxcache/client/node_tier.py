"""The node-local tier as a session runs it: the directory JAX reads (:mod:`jaxcache.client.local_tier`) and the
write-behind uploads of what JAX writes there (:mod:`jaxcache.client.uploads`)."""

from __future__ import annotations

import os
from collections.abc import Callable

from jaxcache import entry
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.local_tier import LocalTier
from jaxcache.client.options import DEFAULT_LOCAL_MAX_BYTES, ClientOptions
from jaxcache.client.uploads import Uploader
from jaxcache.records import LocalTierCounts
from jaxcache.storage import Storage


class NodeTier:
    """One process's node-local tier: made at ``enable_cache``, started before anything compiles."""

    def __init__(self, directory: str, root: Callable[[], Storage], options: ClientOptions, *,
                 policy: LoadPolicy | None, refused: Callable[[str, str], None] | None,
                 writer_name: Callable[[], str]) -> None:
        self.policy = policy
        self.tier = LocalTier(directory, root, policy=policy, refused=refused or (lambda _key, _why: None),
                              max_size_bytes=options.max_size_bytes or DEFAULT_LOCAL_MAX_BYTES)
        self.uploader = Uploader(self.tier, root, signing_key=options.signing_key, writer_name=writer_name,
                                 signed_dir=policy is not None and policy.mode == "signed")

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
        unverified = set(self.uploader.unverified())
        dropped = self.tier.revalidate(() if policy is None else set(policy.bad), pending=self.uploader.pending,
                                       need_signature=policy is not None and policy.mode == "signed",
                                       unverified=unverified)
        # Dropped here, or evicted since: their marks go too.
        self.uploader.forget_unverified([k for k in unverified if k in dropped or not os.path.exists(
            os.path.join(self.tier.directory, entry.cache_name(k)))])
        self.uploader.resume(self.uploader.pending())
        self.tier.install()  # it judges what it fetches; its local files are trusted as admitted

    def counts(self) -> LocalTierCounts:
        """What the tier did so far in this process."""
        return self.tier.snapshot()

    def summary(self) -> str:
        """The summary line's part about the tier."""
        c = self.tier.snapshot()
        failed = c.upload_failed + c.upload_pending
        return (f"; local tier {c.directory}: {c.loaded} loaded locally, {c.fetched} fetched on demand"
                f" ({c.fetched_s:.2f} s), {c.uploaded} uploaded" + (f", {failed} not uploaded" if failed else ""))
