"""A root's whole listing where that costs one listing request: the node-local tier's start checks every copy it holds
at once against a small root, and each copy on its own against a large one (whose listing would take a request per
page, growing with the root rather than with what the node holds)."""

from __future__ import annotations

from jaxcache.storage.base import Listed, Storage

#: Objects directly under the root beyond which it is not small: half a page of the smallest store's listing (S3 and
#: GCS answer 1,000 objects a page, Azure 5,000; folders share a page with them), so the object after the last one
#: kept comes from the first page too, and a listing that stops there never asks for a second.
SMALL_OBJECTS = 500


def small_listing(storage: Storage, suffixes: tuple[str, ...] = (), *,
                  most: int = SMALL_OBJECTS) -> list[Listed] | None:
    """The objects directly under the root whose names end in one of ``suffixes`` (all without), as
    ``(name, size_bytes, mtime_s, version)`` like :meth:`Storage.list_stats`, when the root holds at most ``most``
    objects there (of any name); None when it holds more, found out from the listing's first page alone."""
    found: list[Listed] = []
    objects = storage.iter_objects()
    try:
        for seen, info in enumerate(objects, start=1):
            if seen > most:
                return None
            if not suffixes or info.name.endswith(suffixes):
                found.append((info.name, info.size_bytes, info.mtime_s, info.version))
    finally:
        close = getattr(objects, "close", None)
        if close is not None:
            close()  # a generator left at its first page asks for no other
    return found
