"""A root as the commands that read heads see it (``ls``, ``stats``, ``prune --corrupt``): through its head index,
unless ``--no-index``, ``JAXCACHE_INDEX=off`` or an unusable index directory say otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from jaxcache.answers import KeptAnswer
from jaxcache.head_index import INDEX_ENV, HeadIndex
from jaxcache.scan import Record
from jaxcache.scan_indexed import list_root, scan_indexed
from jaxcache.storage import Storage

INDEX_HELP = (f"read every entry again instead of using the head index (kept per root in the user's cache directory; "
              f"{INDEX_ENV}=off turns it off everywhere)")


def _warn(message: str) -> None:
    print(f"jaxcache: warning: {message}", file=sys.stderr)


class IndexedRoot:
    """The root's head index (None: not used, or unusable) and, with one, the listing it compares with, taken once:
    it also says whether a command's last answer still holds."""

    def __init__(self, storage: Storage, *, use_index: bool = True) -> None:
        self.storage = storage
        self.index = HeadIndex.for_storage(storage, warn=_warn) if use_index else None
        if self.index is not None:
            self.index.used()
        self.listed = list_root(storage) if self.index is not None else None

    def kept(self, command: str, options: tuple[object, ...]) -> KeptAnswer | None:
        if self.index is None or self.listed is None:
            return None
        return KeptAnswer(self.index, command, (self.storage.url, *options), self.listed.digest)

    def records(self, *, read_headers: bool = True) -> Iterator[Record]:
        # Without an index too, from one listing of the whole root (these commands hold every entry anyway): an
        # -atime file is read only where the listing has one, so a root without JAX's LRU (the default) costs its
        # listing and nothing per entry, where a streaming scan tries each entry's -atime.
        return scan_indexed(self.storage, self.index, read_headers=read_headers, listed=self.listed)
