"""Storage backends for cache roots, chosen by URL. Only this package knows about URLs and schemes."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlparse

from jaxcache.errors import InvalidRootError, PathEscapeError
from jaxcache.storage.base import ObjectInfo, Storage, check_name
from jaxcache.storage.local import LocalStorage

__all__ = ["ObjectInfo", "Storage", "LocalStorage", "check_name", "open_storage", "is_gcs_url"]

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def is_gcs_url(url: str) -> bool:
    """True for ``gs://`` URLs."""
    return str(url).startswith("gs://")


def open_storage(url: str | os.PathLike[str], *, must_exist: bool = True) -> Storage:
    """Open a cache root: a local path, ``file:///path``, or ``gs://bucket/prefix``.

    A local root must exist unless ``must_exist`` is False. google-cloud-storage is imported only for gs://.
    """
    text = os.fspath(url)
    if not text:
        raise InvalidRootError("empty cache root: give a directory, file:///path or gs://bucket/prefix")
    if is_gcs_url(text):
        bucket, _, prefix = text[len("gs://") :].partition("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise InvalidRootError(f"{text!r}: {bucket!r} is not a valid bucket name")
        prefix = prefix.strip("/")
        if prefix:
            try:
                check_name(prefix)
            except PathEscapeError as exc:
                raise InvalidRootError(f"{text!r}: the prefix is not a clean path ({exc})") from None
        from jaxcache.storage.gcs import GcsStorage

        return GcsStorage(bucket, prefix)
    if text.startswith("file://"):
        parsed = urlparse(text)
        if parsed.netloc not in ("", "localhost"):
            raise InvalidRootError(f"{text!r}: file:// URLs must name a local path (file:///path)")
        return LocalStorage(unquote(parsed.path), must_exist=must_exist)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        raise InvalidRootError(f"{text!r}: unsupported scheme {scheme!r}; use a directory or gs://bucket/prefix")
    return LocalStorage(text, must_exist=must_exist)

