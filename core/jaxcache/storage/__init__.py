"""Storage backends for cache roots, chosen by URL. Only this package knows about URLs and schemes.

Each object store is one module here and one row of :data:`STORES` (its scheme, module and class, and how it names
its buckets): adding a store is that module, that row and their tests. Nothing outside this package needs to know a
scheme: :func:`open_storage` opens a root, :func:`normalise_root` spells it one way, :func:`is_object_store` and
:func:`scheme_of` tell what it is.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from jaxcache.errors import InvalidRootError, PathEscapeError
from jaxcache.storage.base import ObjectInfo, Storage, check_name, same_object
from jaxcache.storage.local import LocalStorage

__all__ = [
    "ObjectInfo", "Storage", "LocalStorage", "STORES", "Store", "check_name", "open_storage", "normalise_root",
    "is_gcs_url", "is_object_store", "same_object", "scheme_of", "split_root",
]


@dataclass(frozen=True)
class Store:
    """One object store: the scheme of its URLs (``scheme://bucket/prefix``, as JAX's cache takes them), the module
    and class that implement it (imported only when such a root is opened), and the rule for its bucket names."""

    scheme: str
    module: str
    cls: str
    #: What the store calls the first part of the URL, for messages ("bucket", "container").
    bucket_word: str
    bucket_rule: re.Pattern[str]
    bucket_help: str


STORES: dict[str, Store] = {s.scheme: s for s in (
    Store("gs", "jaxcache.storage.gcs", "GcsStorage", "bucket", re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
          "3-222 lowercase letters, digits, dots, hyphens and underscores"),
    # Today's rules (3-63 lowercase letters, digits, dots and hyphens) and the older ones some buckets still have
    # (up to 255 characters, capitals and underscores).
    Store("s3", "jaxcache.storage.s3", "S3Storage", "bucket",
          re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]"),
          "3-63 lowercase letters, digits, dots and hyphens"),
    Store("az", "jaxcache.storage.azure", "AzureStorage", "container",
          re.compile(r"[a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9]"),
          "3-63 lowercase letters, digits and single hyphens"),
)}

# Other tools' names for these stores, which JAX's cache (etils epath) does not take: the hint a user needs.
_OTHER_SCHEMES = {"gcs": "gs", "s3a": "s3", "s3n": "s3", "abfs": "az", "abfss": "az", "wasb": "az", "wasbs": "az"}
_ROOT_FORMS = "a directory, file:///path, gs://bucket/prefix, s3://bucket/prefix or az://container/prefix"


def is_gcs_url(url: str) -> bool:
    """True for ``gs://`` URLs."""
    return str(url).startswith("gs://")


def scheme_of(url: str | os.PathLike[str]) -> str | None:
    """The object store a root URL names (``"gs"``, ``"s3"``, ``"az"``: a key of :data:`STORES`), or None for a
    directory (a path or ``file://``) and for what is no root at all."""
    scheme, sep, _ = os.fspath(url).strip().partition("://")
    return scheme if sep and scheme in STORES else None


def is_object_store(url: str | os.PathLike[str]) -> bool:
    """True for a root in an object store (``gs://``, ``s3://``, ``az://``), False for a directory."""
    return scheme_of(url) is not None


def split_root(url: str) -> tuple[Store, str, str]:
    """An object-store root as (its store, its bucket, its prefix), the prefix without empty parts or a slash at
    either end (``s3://b//p/`` is ``s3://b/p``). Raises :class:`InvalidRootError` for a bucket the store does not
    allow, a prefix with ``.`` or ``..`` in it, and a URL that is not an object store's."""
    scheme, sep, rest = url.partition("://")
    store = STORES.get(scheme) if sep else None
    if store is None:
        raise InvalidRootError(f"{url!r} is not an object-store root ({', '.join(f'{s}://' for s in STORES)})")
    bucket, _, prefix = rest.partition("/")
    if store.scheme == "az" and "@" in bucket:
        # adlfs would read the part after @ as the account only in its abfs:// form, and etils hands it az:// with
        # an account from the environment: JAX would write elsewhere than this names.
        raise InvalidRootError(
            f"{url!r}: az:// names the container only; the account comes from AZURE_STORAGE_ACCOUNT_NAME or "
            "AZURE_STORAGE_CONNECTION_STRING, as JAX's cache (through adlfs) reads it: write az://container/prefix"
        )
    if not store.bucket_rule.fullmatch(bucket):
        raise InvalidRootError(f"{url!r}: {bucket!r} is not a valid {store.bucket_word} name ({store.bucket_help})")
    prefix = "/".join(part for part in prefix.split("/") if part)
    if prefix:
        try:
            check_name(prefix)
        except PathEscapeError as exc:
            raise InvalidRootError(f"{url!r}: the prefix is not a clean path ({exc})") from None
    return store, bucket, prefix


def _local_path(text: str) -> str | None:
    """The path a ``file://`` URL names, None for anything else; raises for a URL on another host."""
    if not text.startswith("file://"):
        return None
    parsed = urlparse(text)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidRootError(f"{text!r}: file:// URLs must name a local path (file:///path)")
    return unquote(parsed.path)


def _unsupported(text: str) -> InvalidRootError:
    scheme = text.split("://", 1)[0]
    hint = f" (write {_OTHER_SCHEMES[scheme]}://: JAX's cache takes only that)" if scheme in _OTHER_SCHEMES else ""
    return InvalidRootError(f"{text!r}: unsupported scheme {scheme!r}{hint}; use {_ROOT_FORMS}")


def normalise_root(url: str | os.PathLike[str]) -> str:
    """One spelling per cache root, so that every process (the client configuring JAX, the service, the CLI) names
    a root the same way and reaches the same cache.

    An object-store root loses surrounding blanks, empty parts and the slash at the end (``gs://b//p/`` is
    ``gs://b/p``); ``file:///p`` is ``/p``; a local path becomes absolute, ``~`` expanded and links resolved.
    Raises :class:`InvalidRootError` for what is no root (see :func:`split_root`).
    """
    text = os.fspath(url).strip()
    if not text:
        raise InvalidRootError(f"empty cache root: give {_ROOT_FORMS}")
    if is_object_store(text):
        store, bucket, prefix = split_root(text)
        return f"{store.scheme}://{bucket}/{prefix}" if prefix else f"{store.scheme}://{bucket}"
    path = _local_path(text)
    if path is None:
        if "://" in text:
            raise _unsupported(text)
        path = text
    return os.path.realpath(os.path.expanduser(path))


def open_storage(url: str | os.PathLike[str], *, must_exist: bool = True) -> Storage:
    """Open a cache root: a local path, ``file:///path``, or ``scheme://bucket/prefix`` of a store in
    :data:`STORES`.

    A local root must exist unless ``must_exist`` is False. A store's client library is imported only when a root
    of it is opened (a :class:`~jaxcache.errors.MissingDependencyError` names the extra to install).
    """
    text = os.fspath(url)
    if not text.strip():
        raise InvalidRootError(f"empty cache root: give {_ROOT_FORMS}")
    if is_object_store(text):
        store, bucket, prefix = split_root(text.strip())
        backend: Callable[[str, str], Storage] = getattr(importlib.import_module(store.module), store.cls)
        return backend(bucket, prefix)
    path = _local_path(text)
    if path is not None:
        return LocalStorage(path, must_exist=must_exist)
    if "://" in text:
        raise _unsupported(text)
    return LocalStorage(text, must_exist=must_exist)
