"""A cache root under ``az://container/prefix``, through azure-storage-blob.

Imported only when an az:// root is opened. The account and its credentials come from the environment, read as
adlfs reads them for JAX's own az:// cache (so both reach the same account): ``AZURE_STORAGE_CONNECTION_STRING``;
or ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``, a service
principal (``AZURE_STORAGE_CLIENT_ID``, ``AZURE_STORAGE_CLIENT_SECRET``, ``AZURE_STORAGE_TENANT_ID``), anonymous
access (``AZURE_STORAGE_ANON``), or else the Azure credential chain (workload identity, managed identity, ``az
login``; azure-identity's ``DefaultAzureCredential``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from jaxcache.errors import (
    InvalidInputError,
    InvalidRootError,
    JaxcacheError,
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
    etag_token,
    missing_library,
    store_timeout_s,
    without_userinfo,
)

try:
    from azure.core import MatchConditions
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ResourceModifiedError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )
    from azure.core.pipeline.transport import RequestsTransport
    from azure.storage.blob import BlobProperties, BlobServiceClient, ContentSettings, ExponentialRetry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(missing_library("az://", "azure-storage-blob azure-identity", "azure")) from exc

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_ENV = "AZURE_STORAGE_ACCOUNT_NAME"
#: The initial_backoff of azure-storage-blob's ExponentialRetry, which retries a request Azure answered 5xx (503
#: ServerBusy is its throttling) or whose answer was lost: retry n waits this plus 3^n seconds. Unset: the library's
#: own policy (15 s, so 18 s, 24 s, 42 s, each give or take 3 s).
RETRY_DELAY_ENV = "JAXCACHE_AZURE_RETRY_DELAY_S"
#: How many times that policy tries a request again (retry_total), as AWS_MAX_ATTEMPTS bounds botocore's tries and
#: JAXCACHE_GCS_RETRY_DEADLINE_S google-cloud-storage's. Unset: the library's 3, which wait 42-84 s in all.
RETRIES_ENV = "JAXCACHE_AZURE_RETRIES"
#: A storage account's name, as Azure allows it (and it becomes a host name).
_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_PAGE = 5000  # the most one listing request returns
_POOL = 32  # connections kept to the endpoint: the threads of AzureStorage.io_workers and a listing beside them
# azure-core gathers an answer's body with list() over a generator whose len() is the body's length: a list slot (8
# bytes) per byte before the join, so a GET of N bytes holds about 9N at its peak. Hence GETs of bounded size: whole
# reads in 4 MiB pieces from the first (the library's first is 32 MiB: 288 MiB held), streams in 512 KiB ones.
_GET_BYTES = 4 << 20
_STREAM_BYTES = 512 << 10
_CREDENTIALS_HELP = (
    f"set {CONNECTION_STRING_ENV}, or {ACCOUNT_ENV} with AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or "
    "sign in to Azure (workload identity, managed identity, `az login`)"
)
# Answers that say the credentials themselves are wrong, not that they may not do this.
_REJECTED = {"AuthenticationFailed", "InvalidAuthenticationInfo", "NoAuthenticationInformation"}
_OCTETS = ContentSettings(content_type="application/octet-stream")


def retry_policy() -> ExponentialRetry | None:
    """azure-storage-blob's ExponentialRetry with its initial backoff from :data:`RETRY_DELAY_ENV` and its retries
    from :data:`RETRIES_ENV`; None (the library's own) where neither is set."""
    delay = env_seconds(RETRY_DELAY_ENV, "added to each wait before a retry", 60)
    text = os.environ.get(RETRIES_ENV, "").strip()
    if text and not (text.isascii() and text.isdigit() and int(text[:3]) <= 10):
        raise InvalidInputError(f"{RETRIES_ENV}={text[:40]!r}: give how many times a request is tried again, 0 to 10")
    settings: dict[str, Any] = {}
    if delay is not None:  # the library types its seconds as int; it computes with floats
        settings.update(initial_backoff=delay, random_jitter_range=min(3, delay))
    if text:
        settings["retry_total"] = int(text)
    return ExponentialRetry(**settings) if settings else None


def _transport() -> RequestsTransport:
    """azure-core's transport, its connection pools as large as :attr:`AzureStorage.io_workers` needs (requests'
    default of 10 discards the connections of the threads past it, with a warning each), its timeouts
    :func:`store_timeout_s` (a transport handed to the client keeps azure-core's 300 s, not the client's own)."""
    timeout = store_timeout_s()
    transport = RequestsTransport(connection_timeout=timeout, read_timeout=timeout)
    transport.open()  # azure-core sets up its session and adapters (no urllib3 retries of their own)
    for adapter in transport.session.adapters.values():
        adapter.init_poolmanager(_POOL, _POOL)
    return transport


def _check_key(where: str, key: str) -> None:
    # An account key is base64; another is refused only by the first request, as "no Azure credentials".
    try:
        base64.b64decode(key.strip(), validate=True)
    except ValueError:
        raise InvalidInputError(f"{where} is not an account key (base64): copy it again from the storage account's "
                                "access keys") from None


def _check_connection_string(connection: str) -> None:
    """One line naming what to fix in ``AZURE_STORAGE_CONNECTION_STRING`` where the library would take it and then
    fail on each request: a BlobEndpoint that is no URL (``notaurl`` becomes ``https://notaurl``, tried for minutes),
    an AccountKey that is not base64."""
    fields = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in connection.split(";")) if k}
    if (endpoint := fields.get("blobendpoint")) is not None:
        check_endpoint(f"{CONNECTION_STRING_ENV}: BlobEndpoint", endpoint, "or leave it out for the account's own")
    if (key := fields.get("accountkey")) is not None:
        _check_key(f"{CONNECTION_STRING_ENV}: its AccountKey", key)


def _credential() -> Any:
    """The credential for ``AZURE_STORAGE_ACCOUNT_NAME``, chosen as adlfs chooses it."""
    env = os.environ
    account = env[ACCOUNT_ENV]
    if env.get("AZURE_STORAGE_ACCOUNT_KEY"):
        _check_key("AZURE_STORAGE_ACCOUNT_KEY", env["AZURE_STORAGE_ACCOUNT_KEY"])
        return AzureNamedKeyCredential(account, env["AZURE_STORAGE_ACCOUNT_KEY"])
    if env.get("AZURE_STORAGE_SAS_TOKEN"):
        return AzureSasCredential(env["AZURE_STORAGE_SAS_TOKEN"].lstrip("?"))
    if env.get("AZURE_STORAGE_ANON", "false").lower() not in ("false", "0", "f", ""):
        return None
    try:
        from azure import identity
    except ImportError as exc:
        raise MissingDependencyError(
            f"az:// roots without a key or SAS token sign in through azure-identity: pip install azure-identity "
            f"(or set {CONNECTION_STRING_ENV}, AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN)"
        ) from exc
    if env.get("AZURE_STORAGE_CLIENT_ID"):
        return identity.ClientSecretCredential(env.get("AZURE_STORAGE_TENANT_ID", ""), env["AZURE_STORAGE_CLIENT_ID"],
                                               env.get("AZURE_STORAGE_CLIENT_SECRET", ""))
    return identity.DefaultAzureCredential()


def _code(exc: HttpResponseError) -> str:
    code = getattr(exc, "error_code", None)  # set by azure-storage-blob from the answer's x-ms-error-code
    return str(getattr(code, "value", code) or "")


class AzureStorage(ObjectStore):
    """Blobs under ``prefix/`` in ``container``. Listing is in lexicographic order; a blob's version is its ETag;
    mtimes are whole seconds."""

    def __init__(self, container: str, prefix: str, *, service: BlobServiceClient | None = None) -> None:
        self._set_root("az", container, prefix)
        if service is None:
            options: dict[str, Any] = {"max_single_get_size": _GET_BYTES, "max_chunk_get_size": _GET_BYTES,
                                       "transport": _transport()}
            if (policy := retry_policy()) is not None:
                options["retry_policy"] = policy
            if connection := os.environ.get(CONNECTION_STRING_ENV):
                _check_connection_string(connection)
                try:
                    service = BlobServiceClient.from_connection_string(connection, **options)
                except ValueError as exc:
                    raise InvalidInputError(f"{CONNECTION_STRING_ENV} is not a connection string "
                                            f"({without_userinfo(str(exc))})") from None
            elif account := os.environ.get(ACCOUNT_ENV):
                if not _ACCOUNT.fullmatch(account):
                    raise InvalidInputError(f"{ACCOUNT_ENV}={account[:80]!r} is not a storage account's name (3-24 "
                                            "lowercase letters and digits)")
                service = BlobServiceClient(f"https://{account}.blob.core.windows.net", credential=_credential(),
                                            **options)
            else:
                raise StorageError(f"no Azure storage account for {self.url}: {_CREDENTIALS_HELP}")
        self._service = service
        self._container = service.get_container_client(container)
        # The account's endpoint, without a SAS token or a user and password (a BlobEndpoint's userinfo): az:// names
        # no account, so the endpoint is part of the root, and it shows in messages and the service's answers.
        parts = urlsplit(service.primary_endpoint)
        self.endpoint = without_userinfo(f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/"))

    @property
    def identity(self) -> str:
        return f"{self.url} at {self.endpoint}"

    def _error(self, where: str, exc: AzureError) -> JaxcacheError:
        said = without_userinfo(str(exc.message))  # azure-core's text names the URL it asked
        if isinstance(exc, ClientAuthenticationError) and exc.status_code is None:  # the credential's, no request
            return StorageError(f"{where}: no Azure credentials ({said}): {_CREDENTIALS_HELP}")
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)):
            return StorageError(f"{where} failed: cannot reach Azure Blob Storage at {self.endpoint} ({said})")
        if not isinstance(exc, HttpResponseError):
            return StorageError(f"{where} failed: {said}")
        code, status = _code(exc), exc.status_code or 0
        if status == 412 or code == "ConditionNotMet":
            return PreconditionFailedError(f"{where}: the object changed since it was listed")
        if code == "BlobAlreadyExists":  # a create-only write's If-None-Match: *
            return PreconditionFailedError(f"{where}: the object already exists")
        if code == "ContainerNotFound":
            return InvalidRootError(f"container {self.bucket_name!r} does not exist ({self.identity})")
        if code in _REJECTED or status == 401:
            return StoragePermissionError(f"{where}: the credentials were rejected ({code}): {_CREDENTIALS_HELP}")
        if status == 403:  # what Azurite answers a wrong key with too (AuthorizationFailure)
            return StoragePermissionError(
                f"{where}: permission denied ({code}); grant the identity the Storage Blob Data Contributor role on "
                f"container {self.bucket_name} (Reader, to read only), and check the credentials: "
                f"{_CREDENTIALS_HELP}"
            )
        reason = without_userinfo(str(exc.reason)) if exc.reason else said
        return StorageError(f"{where} failed: {code or status}: {reason}")

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        # The one place azure-core's errors become ours. The library's retry policy (retry_policy) already handled
        # 5xx answers and lost connections before anything reaches this point.
        where = f"{op} {name!r} in {self.url}"
        try:
            yield
        except AzureError as exc:
            raise self._error(where, exc) from exc

    def _info(self, blob: BlobProperties, name: str | None = None) -> ObjectInfo:
        mtime = float(int(blob.last_modified.timestamp())) if blob.last_modified is not None else 0.0
        return ObjectInfo(str(blob.name)[len(self._base):] if name is None else name, int(blob.size or 0), mtime,
                          etag_token(blob.etag) if blob.etag else None)

    def _listing(self, prefix: str, recursive: bool) -> Iterator[BlobProperties]:
        """The blobs of a listing; without ``recursive``, those directly under ``prefix`` (no virtual folders)."""
        if recursive:
            yield from self._container.list_blobs(name_starts_with=prefix, results_per_page=_PAGE)
            return
        for item in self._container.walk_blobs(name_starts_with=prefix, delimiter="/", results_per_page=_PAGE):
            if isinstance(item, BlobProperties):  # not a BlobPrefix (a folder)
                yield item

    def iter_objects(self, prefix: str = "", *, recursive: bool = False) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        with self._translate("list", prefix or "."):
            for blob in self._listing(self._base + prefix, recursive):
                yield self._info(blob)

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        out: list[Listed] = []
        with self._translate("list", "."):
            for blob in self._listing(self._base, False):
                info = self._info(blob)
                if not suffixes or info.name.endswith(suffixes):
                    out.append((info.name, info.size_bytes, info.mtime_s, info.version))
        return out

    def _properties(self, name: str) -> BlobProperties | None:
        with self._translate("stat", name):
            try:
                return self._container.get_blob_client(self._key(name)).get_blob_properties()
            except ResourceNotFoundError as exc:
                if _code(exc) == "ContainerNotFound":
                    raise
                return None

    def stat(self, name: str) -> ObjectInfo | None:
        blob = self._properties(name)
        return None if blob is None else self._info(blob)

    def _download(self, name: str, **params: Any) -> bytes | None:
        """The blob's bytes (a range of them with ``offset`` and ``length``), or None if there is none."""
        got = self._download_with_properties(name, **params)
        return None if got is None else got[0]

    def _download_with_properties(self, name: str, **params: Any) -> tuple[bytes, BlobProperties | None] | None:
        """The blob's bytes and the properties of the blob they came from, or None if there is none."""
        self.reads += 1
        with self._translate("read", name):
            try:
                # decompress=False: the bytes as stored (the library decodes a Content-Encoding by default), and a
                # blob that has one is refused before more than the first piece of it was read.
                stream = self._container.download_blob(self._key(name), decompress=False, **params)
                self._as_stored(name, stream.properties.content_settings.content_encoding)
                data: bytes = stream.readall()
                return data, stream.properties
            except ResourceNotFoundError as exc:
                if _code(exc) == "ContainerNotFound":
                    raise
                return None
            except HttpResponseError as exc:
                if exc.status_code == 416:  # from past the end: the blob is there, with nothing there
                    return b"", None
                raise

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        if length <= 0:
            return b"" if self.exists(name) else None
        return self._download(name, offset=offset, length=length)

    def read(self, name: str) -> bytes | None:
        return self._download(name)

    def read_with_info(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        # The download's properties name the version (ETag) of the bytes it returned; a blob read in pieces is read
        # from that one version only (the library sends If-Match after the first).
        got = self._download_with_properties(name)
        if got is None or (properties := got[1]) is None:
            return None
        return got[0], self._info(properties, name)

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        blob = self._properties(name)
        if blob is None:
            return None
        self._as_stored(name, blob.content_settings.content_encoding)  # the ranges come from this version only
        return self._chunks(name, int(blob.size or 0), str(blob.etag), chunk_bytes)

    def _chunks(self, name: str, size: int, etag: str, chunk_bytes: int) -> Iterator[bytes]:
        # Each range only from the version first seen (If-Match): a replaced blob cannot splice into the bytes read.
        step = min(chunk_bytes, _STREAM_BYTES)
        for start in range(0, size, step):
            self.reads += 1
            with self._translate("read", name):
                try:
                    chunk: bytes = self._container.download_blob(
                        self._key(name), offset=start, length=min(step, size - start), etag=etag,
                        match_condition=MatchConditions.IfNotModified, decompress=False,
                    ).readall()
                except (ResourceNotFoundError, ResourceModifiedError) as exc:
                    if _code(exc) == "ContainerNotFound":
                        raise
                    raise self._replaced(name) from None
            yield chunk

    def delete(self, name: str, *, if_version: str | None = None) -> bool:
        condition: dict[str, Any] = {}
        if if_version is not None:  # If-Match: Azure refuses the delete if the blob was replaced since listed
            condition = {"etag": if_version, "match_condition": MatchConditions.IfNotModified}
        try:
            with self._translate("delete", name):
                try:
                    self._container.delete_blob(self._key(name), **condition)
                except ResourceNotFoundError as exc:
                    if _code(exc) == "ContainerNotFound":
                        raise
                    return False
        except PreconditionFailedError:
            # If-Match fails on a blob that is gone as on one replaced: gone is "already deleted", as without it.
            if self._properties(name) is None:
                return False
            raise
        return True

    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False, if_version: str | None = None) -> None:
        # One Put Blob (or, past 64 MiB, blocks committed at once): readers see the old blob or the whole new one.
        # overwrite=False sends If-None-Match: *; if_version, If-Match (412 when replaced or deleted since).
        if create_only and if_version is not None:
            raise InvalidInputError("create_only and if_version exclude each other: a create has no earlier version")
        condition: dict[str, Any] = {}
        if if_version is not None:
            condition = {"etag": if_version, "match_condition": MatchConditions.IfNotModified}
        with self._translate("write", name):
            try:
                self._container.upload_blob(self._key(name), data, overwrite=not create_only,
                                            content_settings=_OCTETS, **condition)
            except (ResourceExistsError, ResourceModifiedError):
                # The library retries a Put whose answer was lost; when that attempt had created the blob, the retry's
                # 409 is about our own write. A blob holding exactly our bytes means the create happened; anything
                # else (or nothing) there is someone else's doing. (Not for a replace: see Storage.write_atomic.)
                if not create_only or self.read(name) != data:
                    raise
