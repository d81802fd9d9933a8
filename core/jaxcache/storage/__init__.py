"""Storage backends for cache roots, chosen by URL. Only this package knows about URLs and schemes.

Each object store is one module here and one row of :data:`STORES` (its scheme, module and class, and how it names
its buckets): adding a store is that module, that row and their tests. Nothing outside this package needs to know a
scheme: :func:`open_storage` opens a root, :func:`normalise_root` spells it one way, :func:`is_object_store` and
:func:`scheme_of` tell what it is. An object's version (:attr:`ObjectInfo.version`) is an opaque token each store
defines; :func:`same_object` is the one rule for "the same object seen twice".
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from jaxcache.errors import InvalidRootError, PathEscapeError
from jaxcache.numbers import whole
from jaxcache.storage.base import ObjectInfo, Storage, check_name, same_object, same_stat
from jaxcache.storage.local import LocalStorage
from jaxcache.storage.named import check_named, spelled

__all__ = [
    "ObjectInfo", "Storage", "LocalStorage", "STORES", "Store", "check_name", "open_storage", "normalise_root",
    "open_named_root", "spelled_root",
    "ABSOLUTE_ROOT_PATTERN", "ROOT_FORMS", "generation_of", "is_object_store", "removal_command", "same_object",
    "same_stat", "scheme_of", "split_root",
]


@dataclass(frozen=True)
class Store:
    """One object store: the scheme of its URLs (``scheme://bucket/prefix``, as JAX's cache takes them), the module
    and class that implement it (imported only when such a root is opened), and the rule for its bucket names."""

    scheme: str
    module: str
    cls: str
    #: The extra of jaxcache's distributions that brings the store's client library (``pip install './core[...]'``).
    extra: str
    #: What the store calls the first part of the URL, for messages ("bucket", "container").
    bucket_word: str
    bucket_rule: re.Pattern[str]
    bucket_help: str
    #: What an object's version token (ObjectInfo.version) holds there, for the API's documentation.
    version_help: str
    #: The store's own command line that removes the objects matching globs (``key-*``) under a bucket's prefix.
    remove_command: Callable[[str, str, list[str]], str]
    #: Versions are whole numbers that clients may read as such (GCS's generations).
    integer_versions: bool = False


def _under(prefix: str, glob: str) -> str:
    return f"{prefix}/{glob}" if prefix else glob


def _gcloud_rm(bucket: str, prefix: str, globs: list[str]) -> str:
    # gcloud expands the wildcards itself.
    return "gcloud storage rm " + " ".join(shlex.quote(f"gs://{bucket}/{_under(prefix, g)}") for g in globs)


def _aws_rm(bucket: str, prefix: str, globs: list[str]) -> str:
    # The AWS CLI takes no wildcards in a URL: a recursive rm under the prefix, filtered to the names.
    where = shlex.quote(f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/")
    return f"aws s3 rm {where} --recursive --exclude '*' " + " ".join(f"--include {shlex.quote(g)}" for g in globs)


def _az_rm(container: str, prefix: str, globs: list[str]) -> str:
    # One pattern a call; the account comes from the environment, as for jaxcache.
    return " && ".join(f"az storage blob delete-batch --source {shlex.quote(container)} --pattern "
                       f"{shlex.quote(_under(prefix, g))}" for g in globs)


STORES: dict[str, Store] = {s.scheme: s for s in (
    # Each help says what its rule admits, no more and no less (tests/test_root_spelling.py holds them together).
    Store("gs", "jaxcache.storage.gcs", "GcsStorage", "gcs", "bucket",
          re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]"),
          "3-222 lowercase letters, digits, dots, hyphens and underscores, a letter or digit at each end",
          "the object's generation, in decimal digits", _gcloud_rm, integer_versions=True),
    # Today's rules (3-63 lowercase letters, digits, dots and hyphens) and, on purpose, the older ones some buckets
    # still have (up to 255 characters, capitals and underscores): such a bucket is still a root.
    Store("s3", "jaxcache.storage.s3", "S3Storage", "s3", "bucket",
          re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]"),
          "3-255 letters, digits, dots, hyphens and underscores, a letter or digit at each end: today's buckets "
          "take 3-63 lowercase letters, digits, dots and hyphens, older ones may have capitals and underscores",
          "the object's ETag, in its double quotes", _aws_rm),
    Store("az", "jaxcache.storage.azure", "AzureStorage", "azure", "container",
          re.compile(r"[a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9]"),
          "3-63 lowercase letters, digits and hyphens, a letter or digit at each end, no two hyphens in a row",
          "the blob's ETag, in its double quotes", _az_rm),
)}

# Other tools' names for these stores, which JAX's cache (etils epath) does not take: the hint a user needs.
_OTHER_SCHEMES = {"gcs": "gs", "s3a": "s3", "s3n": "s3", "abfs": "az", "abfss": "az", "wasb": "az", "wasbs": "az"}
#: A regular expression that every root spelled absolutely matches (a path from /, a file:// URL, an object store's
#: URL): for the schemas of APIs that take roots another process spelled.
ABSOLUTE_ROOT_PATTERN = "^(/|file://|" + "|".join(f"{scheme}://" for scheme in STORES) + r")[^\x00]*$"
#: Every spelling of a cache root, for messages and help texts.
ROOT_FORMS = "a directory, file:///path, gs://bucket/prefix, s3://bucket/prefix or az://container/prefix"
# A URL of a known scheme spelled amiss: a slash or two missing (`s3:/b`, `gs:b`), backslashes (`s3:\\b`), no colon
# (`s3//b`), a slash too many (`s3:///b`) or the scheme in capitals (`S3://b`). Taken as a path it would quietly be
# a directory here named so, which a job would fill and the CLI find empty.
_AMISS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9]*)(?P<sep>:[/\\]*|//)(?P<rest>.*)", re.DOTALL)


def scheme_of(url: str | os.PathLike[str]) -> str | None:
    """The object store a root URL names (``"gs"``, ``"s3"``, ``"az"``: a key of :data:`STORES`), or None for a
    directory (a path or ``file://``) and for what is no root at all."""
    scheme, sep, _ = os.fspath(url).strip().partition("://")
    return scheme if sep and scheme in STORES else None


def is_object_store(url: str | os.PathLike[str]) -> bool:
    """True for a root in an object store (``gs://``, ``s3://``, ``az://``), False for a directory."""
    return scheme_of(url) is not None


def generation_of(url: str | os.PathLike[str], version: str | None) -> int | None:
    """An object's version as a whole number where the root's store defines it so (GCS's generation, which clients
    of the service's API read as an integer), else None."""
    scheme = scheme_of(url)
    if version is None or scheme is None or not STORES[scheme].integer_versions:
        return None
    return whole(version) if version.isdigit() else None  # ASCII, bounded: numbers.whole


def removal_command(url: str, globs: list[str]) -> str:
    """The object store's own command line that removes the objects under the root ``url`` matching ``globs``
    (names with ``*`` wildcards, such as ``key-*``)."""
    store, bucket, prefix = split_root(url)
    return store.remove_command(bucket, prefix, globs)


def split_root(url: str) -> tuple[Store, str, str]:
    """An object-store root as (its store, its bucket, its prefix), the prefix without empty parts or a slash at
    either end (``s3://b//p/`` is ``s3://b/p``). Raises :class:`InvalidRootError` for a bucket the store does not
    allow, a prefix with ``.`` or ``..`` in it, and a URL that is not an object store's."""
    scheme, sep, rest = url.partition("://")
    store = STORES.get(scheme) if sep else None
    if store is None:
        raise InvalidRootError(f"{url!r} is not an object-store root ({', '.join(f'{s}://' for s in STORES)})")
    bucket, _, prefix = rest.partition("/")
    amiss = _amiss(url) if not bucket else None  # s3:///b
    if amiss is not None:
        raise amiss
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
    """The path a ``file://`` (or ``file:/``) URL names, None for anything else; raises for a URL on another
    host."""
    if not text.startswith("file:/"):
        return None
    parsed = urlparse(text)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidRootError(f"{text!r}: file:// URLs must name a local path (file:///path)")
    return unquote(parsed.path)


def _unsupported(text: str) -> InvalidRootError:
    scheme = text.split("://", 1)[0]
    hint = f" (write {_OTHER_SCHEMES[scheme]}://: JAX's cache takes only that)" if scheme in _OTHER_SCHEMES else ""
    return InvalidRootError(f"{text!r}: unsupported scheme {scheme!r}{hint}; use {ROOT_FORMS}")


def _amiss(text: str) -> InvalidRootError | None:
    """The one-line refusal, naming the spelling meant, of a root that reads as a store's (or a file) URL spelled
    amiss (:data:`_AMISS`); None for anything else, such as ``./data:v2`` or ``runs/a:b``."""
    m = _AMISS.fullmatch(text)
    scheme = m["scheme"].lower() if m else ""
    if m is None or scheme not in (*STORES, *_OTHER_SCHEMES, "file"):
        return None
    if m["sep"] == "://" and m["scheme"] == scheme:
        return None  # spelled right: a root, or another tool's scheme (_unsupported says which to write)
    if scheme == "file" and m["sep"] == ":/":
        return None  # file:/path, RFC 8089's form: a root (_local_path)
    rest = m["rest"].replace("\\", "/").lstrip("/")
    if scheme == "file":
        meant = f"file:///{rest}"
    else:
        meant = f"{_OTHER_SCHEMES.get(scheme, scheme)}://{rest or 'bucket/prefix'}"
    # A directory may be named so: ./ keeps it from reading as a URL (no "://", which no directory root takes).
    directory = "" if "://" in text else f" (a directory so named: write ./{text})"
    return InvalidRootError(f"{text!r} looks like a misspelled URL: did you mean {meant}?{directory}")


def _directory(text: str) -> str:
    """The directory a root that is no object store's names: a path, or a file URL's path. Raises for a URL of
    another scheme and for a store's URL spelled amiss."""
    path = _local_path(text)
    if path is not None:
        return path
    amiss = _amiss(text.strip())
    if amiss is not None:
        raise amiss
    if "://" in text:
        raise _unsupported(text)
    return text


def normalise_root(url: str | os.PathLike[str], *, relative: bool = True) -> str:
    """One spelling per cache root, so that every process (the client configuring JAX, the service, the CLI) names
    a root the same way and reaches the same cache.

    An object-store root loses surrounding blanks, empty parts and the slash at the end (``gs://b//p/`` is
    ``gs://b/p``); ``file:///p`` (or ``file://localhost/p`` or ``file:/p``, %-escapes decoded) is ``/p``; a local
    path becomes absolute, ``~`` expanded and links resolved. Raises :class:`InvalidRootError` for what is no root
    (see :func:`split_root`; a store's URL spelled amiss, ``s3:/b``, names the spelling meant), and without
    ``relative`` for a relative path (or ``~``): one another process spelled, whose folder (or home) is not this
    one's. Whatever judges a local root (whose links may lead where) judges
    :func:`spelled_root`'s path, then reads this one.
    """
    text = spelled_root(url, relative=relative)
    return text if is_object_store(text) else os.path.realpath(text)


def spelled_root(url: str | os.PathLike[str], *, relative: bool = True) -> str:
    """A root as :func:`normalise_root` spells it, but a local path only made absolute (``~`` expanded, after the
    working folder when relative), no link resolved nor ``..`` folded: the path as the user named it, for a judge
    of the links and folders on the way (jaxcache.storage.named)."""
    text = os.fspath(url).strip()
    if not text:
        raise InvalidRootError(f"empty cache root: give {ROOT_FORMS}")
    if is_object_store(text):
        store, bucket, prefix = split_root(text)
        return f"{store.scheme}://{bucket}/{prefix}" if prefix else f"{store.scheme}://{bucket}"
    path = _directory(text)
    if not relative and not os.path.isabs(path):
        raise InvalidRootError(f"{text!r} is a relative path: it names a root only in the process that spelled it")
    return spelled(path) if relative else path


def open_storage(url: str | os.PathLike[str], *, must_exist: bool = True) -> Storage:
    """Open a cache root: a local path, ``file:///path``, or ``scheme://bucket/prefix`` of a store in
    :data:`STORES`.

    A local root must exist unless ``must_exist`` is False. A store's client library is imported only when a root
    of it is opened (a :class:`~jaxcache.errors.MissingDependencyError` names the extra to install).
    """
    text = os.fspath(url)
    if not text.strip():
        raise InvalidRootError(f"empty cache root: give {ROOT_FORMS}")
    if is_object_store(text):
        store, bucket, prefix = split_root(text.strip())
        backend: Callable[[str, str], Storage] = getattr(importlib.import_module(store.module), store.cls)
        return backend(bucket, prefix)
    return LocalStorage(_directory(text), must_exist=must_exist)


def open_named_root(url: str | os.PathLike[str], *, must_exist: bool = True) -> Storage:
    """:func:`open_storage` for a root a user named on a command line: a directory is judged as spelled first, so
    that no command reads, writes or deletes where a link another user owns leads (jaxcache.storage.named)."""
    if not is_object_store(url):
        check_named(spelled_root(url), "the root")
    return open_storage(url, must_exist=must_exist)
