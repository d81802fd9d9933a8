"""A cache root under a ``gs://bucket/prefix``, through google-cloud-storage.

Imported only when a gs:// root is opened, so that nothing else pays for google-cloud-storage.
Honours ``STORAGE_EMULATOR_HOST`` (the library does) for fake-gcs-server in tests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from jaxcache.errors import (
    InvalidInputError,
    InvalidRootError,
    MissingDependencyError,
    PreconditionFailedError,
    StorageError,
    StoragePermissionError,
)
from jaxcache.storage.base import (
    CHUNK_BYTES,
    Listed,
    ObjectInfo,
    ObjectStore,
    check_endpoint,
    check_prefix,
    env_seconds,
    missing_library,
    store_timeout_s,
    without_userinfo,
)

try:
    from google.api_core import exceptions as gexc
    from google.api_core.retry import Retry
    from google.auth import exceptions as auth_exc
    from google.cloud import storage as gcs
    from google.cloud.storage.retry import DEFAULT_RETRY
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(
        missing_library("gs://", "google-cloud-storage", "gcs")
    ) from exc


_PUBLIC_ENDPOINT = "https://storage.googleapis.com"
#: Where google-cloud-storage finds an emulator (fake-gcs-server), its scheme included.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
#: Seconds to wait before retrying a request GCS answered 429 or 5xx (or whose answer was lost), doubling at each
#: retry up to a minute; unset: google-cloud-storage's own policy (from 1 s).
RETRY_DELAY_ENV = "JAXCACHE_GCS_RETRY_DELAY_S"
#: Seconds after which a request's retries stop and it fails; unset: google-cloud-storage's own (120 s).
RETRY_DEADLINE_ENV = "JAXCACHE_GCS_RETRY_DEADLINE_S"
# What a listing needs of each object: smaller pages to send and to parse (a root lists 1,000 objects a page).
_LIST_FIELDS = "items(name,size,updated,generation),nextPageToken"


def retry_policy() -> Retry:
    """google-cloud-storage's retry policy, its first wait from :data:`RETRY_DELAY_ENV` and its deadline from
    :data:`RETRY_DEADLINE_ENV` where they are set."""
    policy: Retry = DEFAULT_RETRY  # the library's (typed Any there)
    delay = env_seconds(RETRY_DELAY_ENV, "of the first wait", 60)
    if delay is not None:
        policy = policy.with_delay(initial=delay, maximum=60.0)
    deadline = env_seconds(RETRY_DEADLINE_ENV, "after which retries stop", 3600)
    if deadline is not None:
        policy = policy.with_timeout(deadline)
    return policy


def _size_pools(client: gcs.Client, connections: int) -> None:
    """Room for ``connections`` kept connections in the client's pools (requests' are 10: the threads of
    :attr:`GcsStorage.io_workers` past them would each throw one away, with a warning)."""
    # The library's own session (google-auth's AuthorizedSession over requests), as its maintainers advise for this.
    for adapter in client._http.adapters.values():
        adapter.init_poolmanager(connections, connections)


def _version(generation: int | None) -> str | None:
    """An object's version token: its generation, as text."""
    return None if generation is None else str(generation)


class GcsStorage(ObjectStore):
    """Objects under ``prefix/`` in ``bucket``. Listing is lexicographic; an object's version is its generation."""

    def __init__(self, bucket: str, prefix: str, *, client: gcs.Client | None = None) -> None:
        self._retry = retry_policy()
        # (connect, read) of every request, listings' pages included: the library's own is 60 s each.
        timeout = store_timeout_s()
        self._timeout = (timeout, timeout)
        self._set_root("gs", bucket, prefix)
        if emulator := os.environ.get(EMULATOR_ENV):  # the library takes it as it is: "host:port" fails each request
            check_endpoint(EMULATOR_ENV, emulator, "or unset it for Cloud Storage itself")
        try:
            self._client = client or gcs.Client()
        except auth_exc.DefaultCredentialsError as exc:
            if credentials := os.environ.get(CREDENTIALS_ENV):  # named, and not what it should be: say so
                said = str(exc.args[0] if exc.args else exc)[:300]  # google-auth's first argument says what is wrong
                raise InvalidInputError(f"{CREDENTIALS_ENV}={credentials[:200]!r}: {said.rstrip('.')}; give the path"
                                        " of a service account's key file (JSON), or unset it") from None
            raise StorageError(
                f"no Google Cloud credentials for {self.url}: run `gcloud auth application-default login`, "
                "set GOOGLE_APPLICATION_CREDENTIALS, or run with a Workload Identity service account"
            ) from exc
        self._bucket = self._client.bucket(bucket)
        _size_pools(self._client, self.io_workers + 1)

    @property
    def endpoint(self) -> str:
        """Where requests go (``STORAGE_EMULATOR_HOST`` changes it), without a user and password it may carry."""
        return without_userinfo(getattr(self._client, "api_endpoint", None) or _PUBLIC_ENDPOINT).rstrip("/")

    @property
    def identity(self) -> str:
        # The same gs:// URL on an emulator (STORAGE_EMULATOR_HOST) is another bucket altogether.
        return self.url if self.endpoint == _PUBLIC_ENDPOINT else f"{self.url} at {self.endpoint}"

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        # The one place google-cloud-storage errors become ours. The library's retry already
        # handled transient 429/5xx answers before anything reaches this point.
        where = f"{op} {name!r} in {self.url}"
        try:
            yield
        except gexc.PreconditionFailed as exc:
            raise PreconditionFailedError(f"{where}: the object changed since it was listed") from exc
        except gexc.Forbidden as exc:
            raise StoragePermissionError(
                f"{where}: permission denied; grant the service account the needed role on "
                f"bucket {self.bucket_name} (see deploy/README.md)"
            ) from exc
        except gexc.Unauthorized as exc:
            said = without_userinfo(exc.message)
            raise StoragePermissionError(f"{where}: credentials were rejected ({said})") from exc
        except auth_exc.GoogleAuthError as exc:
            raise StorageError(f"{where}: authentication failed: {without_userinfo(str(exc))}") from exc
        except gexc.RetryError as exc:  # the retries' deadline passed: the last one's error says why
            reach = f"cannot reach Cloud Storage at {self.endpoint}: " if isinstance(exc.cause, OSError) else ""
            raise StorageError(f"{where} failed: {reach}{without_userinfo(str(exc))}") from exc
        except gexc.GoogleAPIError as exc:
            raise StorageError(f"{where} failed: {without_userinfo(str(exc))}") from exc
        except OSError as exc:  # connection refused, DNS, TLS: requests raises OSError subclasses
            said = without_userinfo(str(exc))
            raise StorageError(f"{where} failed: cannot reach Cloud Storage at {self.endpoint} ({said})") from exc

    def _info(self, blob: gcs.Blob) -> ObjectInfo:
        updated = blob.updated.timestamp() if blob.updated is not None else 0.0
        return ObjectInfo(blob.name[len(self._base) :], blob.size or 0, updated, _version(blob.generation))

    def iter_objects(self, prefix: str = "", *, recursive: bool = False) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        full = self._base + prefix
        with self._translate("list", prefix or "."):
            pages = self._client.list_blobs(
                self._bucket, prefix=full, delimiter=None if recursive else "/", retry=self._retry,
                timeout=self._timeout,
            )
            try:
                for blob in pages:
                    yield self._info(blob)
            except gexc.NotFound as exc:
                raise InvalidRootError(f"bucket {self.bucket_name!r} does not exist ({self.url})") from exc

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        base = len(self._base)
        out: list[Listed] = []
        with self._translate("list", "."):
            pages = self._client.list_blobs(
                self._bucket, prefix=self._base, delimiter="/", fields=_LIST_FIELDS, retry=self._retry,
                timeout=self._timeout,
            )
            try:
                for blob in pages:
                    name = blob.name[base:]
                    if suffixes and not name.endswith(suffixes):
                        continue
                    updated = blob.updated.timestamp() if blob.updated is not None else 0.0
                    out.append((name, blob.size or 0, updated, _version(blob.generation)))
            except gexc.NotFound as exc:
                raise InvalidRootError(f"bucket {self.bucket_name!r} does not exist ({self.url})") from exc
        return out

    def stat(self, name: str) -> ObjectInfo | None:
        with self._translate("stat", name):
            blob = self._bucket.get_blob(self._key(name), retry=self._retry, timeout=self._timeout)
        return None if blob is None else self._info(blob)

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        if length <= 0:
            return b"" if self.exists(name) else None
        blob = self._bucket.blob(self._key(name))
        self.reads += 1
        with self._translate("read", name):
            try:
                data: bytes = blob.download_as_bytes(
                    start=offset, end=offset + length - 1, checksum=None, retry=self._retry, timeout=self._timeout,
                    raw_download=True,
                )
            except gexc.NotFound:
                return None
            except gexc.RequestRangeNotSatisfiable:
                return b""
        self._as_stored(name, blob.content_encoding)
        return data

    def read(self, name: str) -> bytes | None:
        blob = self._bucket.blob(self._key(name))
        self.reads += 1
        with self._translate("read", name):
            try:
                data: bytes = blob.download_as_bytes(retry=self._retry, timeout=self._timeout, raw_download=True)
            except gexc.NotFound:
                return None
        self._as_stored(name, blob.content_encoding)
        return data

    def read_with_info(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        # One request: the download's headers name the generation of exactly the bytes it returned (the library
        # keeps them on the blob). They carry no update time, which a generation makes unneeded.
        blob = self._bucket.blob(self._key(name))
        self.reads += 1
        with self._translate("read", name):
            try:
                data: bytes = blob.download_as_bytes(retry=self._retry, timeout=self._timeout, raw_download=True)
            except gexc.NotFound:
                return None
        self._as_stored(name, blob.content_encoding)
        return data, ObjectInfo(name, len(data), 0.0, _version(blob.generation))

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        with self._translate("read", name):
            blob = self._bucket.get_blob(self._key(name), retry=self._retry, timeout=self._timeout)
        if blob is None:
            return None
        self._as_stored(name, blob.content_encoding)
        # Ranges pinned to the generation listed first: a replaced object cannot splice into the bytes read.
        pinned = self._bucket.blob(self._key(name), generation=blob.generation)
        return self._chunks(pinned, name, blob.size or 0, chunk_bytes)

    def _chunks(self, blob: gcs.Blob, name: str, size: int, chunk_bytes: int) -> Iterator[bytes]:
        for start in range(0, size, chunk_bytes):
            end = min(start + chunk_bytes, size) - 1
            self.reads += 1
            with self._translate("read", name):
                try:
                    chunk: bytes = blob.download_as_bytes(start=start, end=end, checksum=None, retry=self._retry,
                                                          timeout=self._timeout, raw_download=True)
                except gexc.NotFound:
                    raise self._replaced(name) from None
            yield chunk

    def delete(self, name: str, *, if_version: str | None = None) -> bool:
        blob = self._bucket.blob(self._key(name))
        # ifGenerationMatch: GCS refuses the delete if the object was replaced since listed
        if_generation = None if if_version is None else self._generation(name, if_version)
        with self._translate("delete", name):
            try:
                blob.delete(if_generation_match=if_generation, retry=self._retry, timeout=self._timeout)
            except gexc.NotFound:
                return False
        return True

    def _generation(self, name: str, version: str) -> int:
        if not (version.isascii() and version.isdigit()):
            raise InvalidInputError(f"{version!r} is not the generation of {name!r} in {self.url}")
        return int(version)

    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False, if_version: str | None = None) -> None:
        # A GCS upload is atomic by itself: readers see the old object or the whole new one. ifGenerationMatch: 0
        # creates only; the generation read earlier replaces only that one (412 when replaced or deleted since).
        if create_only and if_version is not None:
            raise InvalidInputError("create_only and if_version exclude each other: a create has no earlier version")
        if_generation = 0 if create_only else None if if_version is None else self._generation(name, if_version)
        blob = self._bucket.blob(self._key(name))
        with self._translate("write", name):
            try:
                blob.upload_from_string(
                    data,
                    content_type="application/octet-stream",
                    if_generation_match=if_generation,
                    retry=self._retry, timeout=self._timeout,
                )
            except gexc.PreconditionFailed:
                # The library retries an upload whose response was lost; when that attempt had created the object,
                # the retry's 412 is about our own write. An object holding exactly our bytes means the create
                # happened; anything else (or nothing) there is someone else's doing. (Not for a replace: see
                # Storage.write_atomic.)
                if not create_only or self.read(name) != data:
                    raise
