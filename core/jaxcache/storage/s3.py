"""A cache root under ``s3://bucket/prefix``, through boto3: Amazon S3, or an S3-compatible store (MinIO, Cloudflare
R2, CoreWeave) that ``AWS_ENDPOINT_URL`` names.

Imported only when an s3:// root is opened. Credentials, region and endpoint come the way every AWS tool takes them:
the environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``), the shared
config files, a pod's service account through IRSA (``AWS_ROLE_ARN`` and ``AWS_WEB_IDENTITY_TOKEN_FILE``), or an
instance role.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from jaxcache.errors import (
    EncodedObjectError,
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
    etag_token,
    missing_library,
    store_timeout_s,
    without_userinfo,
)

try:
    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        HTTPClientError,
        InvalidRegionError,
        InvalidRetryConfigurationError,
        NoCredentialsError,
        PartialCredentialsError,
        ProfileNotFound,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError(missing_library("s3://", "boto3", "s3")) from exc

#: Tries of one request in all (the first and its retries) where neither ``AWS_MAX_ATTEMPTS`` nor the profile's
#: ``max_attempts`` says otherwise: botocore's standard mode backs off up to 20 s a retry, so about two minutes in
#: all, as google-cloud-storage's deadline on gs://.
MAX_ATTEMPTS = 10
#: Connections kept to the endpoint: the threads of :attr:`S3Storage.io_workers` and a listing beside them.
_POOL = 32
_CREDENTIALS_HELP = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with an IAM role (a pod's service "
    "account through IRSA, an instance profile)"
)
#: What botocore takes in AWS_RETRY_MODE.
_RETRY_MODES = ("legacy", "standard", "adaptive")
# Answers that say the credentials themselves are wrong, not that they may not do this.
_REJECTED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
             "AuthorizationHeaderMalformed"}


@functools.cache
def _models() -> Any:
    """botocore's loader of service models and endpoints, one for the process: it keeps what it parsed."""
    return botocore.session.get_session().get_component("data_loader")


def retry_settings(session: botocore.session.Session) -> dict[str, Any]:
    """botocore's ``Config(retries=...)``: the standard mode (503 SlowDown, 500s, throttling and dropped connections
    retried with exponential backoff) and :data:`MAX_ATTEMPTS` tries, each only where the environment or the
    profile does not choose (``AWS_RETRY_MODE``, ``AWS_MAX_ATTEMPTS``; ``retry_mode``, ``max_attempts``): botocore
    reads those itself for what is left out here."""
    profile = session.get_scoped_config()
    retries: dict[str, Any] = {}
    if not (os.environ.get("AWS_RETRY_MODE") or profile.get("retry_mode")):
        retries["mode"] = "standard"
    if not (os.environ.get("AWS_MAX_ATTEMPTS") or profile.get("max_attempts")):
        retries["total_max_attempts"] = MAX_ATTEMPTS
    return retries


def _check_settings() -> None:
    """One line naming the variable, where ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, ``AWS_MAX_ATTEMPTS`` or
    ``AWS_RETRY_MODE`` holds what botocore cannot take: it ends in a ValueError of its own for some (``Invalid
    endpoint: notaurl``), and names none of them."""
    env = os.environ
    if env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() != "true":
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if env.get(name):
                check_endpoint(name, env[name], "or unset it for AWS's own")
    attempts = env.get("AWS_MAX_ATTEMPTS", "").strip()
    if attempts and not (attempts.isascii() and attempts.isdigit() and 0 < int(attempts[:6])):
        raise InvalidInputError(f"AWS_MAX_ATTEMPTS={attempts[:40]!r}: give the tries of a request in all (the first "
                                "and its retries), a whole number from 1")
    mode = env.get("AWS_RETRY_MODE", "").strip()
    if mode and mode not in _RETRY_MODES:
        raise InvalidInputError(f"AWS_RETRY_MODE={mode[:40]!r}: use one of {', '.join(_RETRY_MODES)}")


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _missing(exc: ClientError) -> bool:
    """Whether ``exc`` says there is no such object (a HEAD's 404 has no body, so no code but the status)."""
    return _code(exc) in ("NoSuchKey", "404", "NotFound") or (_status(exc) == 404 and _code(exc) != "NoSuchBucket")


class S3Storage(ObjectStore):
    """Objects under ``prefix/`` in ``bucket``. Listing is in UTF-8 binary order, which is the order of names;
    an object's version is its ETag; mtimes are whole seconds (what a HEAD's Last-Modified carries)."""

    def __init__(self, bucket: str, prefix: str, *, session: botocore.session.Session | None = None) -> None:
        self._set_root("s3", bucket, prefix)
        _check_settings()
        try:
            if session is None:
                # A session of its own reads the environment and profiles as they are now; the service models it
                # loads are the process's (parsing them again costs 0.2-0.9 s a root).
                session = botocore.session.get_session()
                session.register_component("data_loader", _models())
            # Resolved once, here: a root without credentials is one clear error when it is opened, as on gs://.
            credentials = session.get_credentials()
            timeout = store_timeout_s()
            config = Config(retries=retry_settings(session), max_pool_connections=_POOL, connect_timeout=timeout,
                            read_timeout=timeout)
            self._client = session.create_client("s3", config=config)
        except InvalidRegionError as exc:
            where = "AWS_DEFAULT_REGION" if os.environ.get("AWS_DEFAULT_REGION") else "the profile's region"
            raise InvalidInputError(f"cannot open {self.url}: {str(exc).rstrip('.')}; set {where} to a region such as"
                                    " us-east-1") from None
        except InvalidRetryConfigurationError as exc:  # a profile's max_attempts or retry_mode (the variables: above)
            raise InvalidInputError(f"cannot open {self.url}: {str(exc).rstrip('.')}; check max_attempts and retry_mode"
                                    " in the profile (~/.aws/config)") from None
        except ValueError as exc:  # botocore's own: an endpoint_url in the profile it cannot parse, and the like
            raise InvalidInputError(f"cannot open {self.url}: {without_userinfo(str(exc)).rstrip('.')}; check the"
                                    " profile's settings (~/.aws/config)") from None
        except ProfileNotFound as exc:
            raise StorageError(f"cannot open {self.url}: {without_userinfo(str(exc))}; set AWS_PROFILE to a profile in "
                               "~/.aws/config") from exc
        except PartialCredentialsError as exc:
            raise StorageError(f"cannot open {self.url}: {without_userinfo(str(exc))}; {_CREDENTIALS_HELP}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"cannot open {self.url}: {without_userinfo(str(exc))}") from exc
        if credentials is None:
            raise StorageError(f"no AWS credentials for {self.url}: {_CREDENTIALS_HELP}")
        # Without a user and password the URL may carry (AWS_ENDPOINT_URL=http://user:pass@host): it shows in
        # messages, in the service's answers and in the identity kept beside the head index.
        self.endpoint = without_userinfo(str(self._client.meta.endpoint_url))
        #: Whether deletes carry If-Match: until the store answers one with 501 Not Implemented.
        self._conditional_deletes = True
        #: Whether replacing writes carry If-Match, until the same answer to one of them.
        self._conditional_writes = True

    @property
    def identity(self) -> str:
        host = urlsplit(self.endpoint).hostname or ""
        # Bucket names are global on AWS; an S3-compatible store (or an emulator) holds other buckets of those names.
        on_aws = host.endswith((".amazonaws.com", ".amazonaws.com.cn"))
        return self.url if on_aws else f"{self.url} at {self.endpoint}"

    def _error(self, where: str, exc: ClientError) -> JaxcacheError:
        code, status = _code(exc), _status(exc)
        message = exc.response.get("Error", {}).get("Message") or code or status
        if code == "PreconditionFailed" or status == 412:  # If-Match, or a create-only write's If-None-Match: *
            return PreconditionFailedError(f"{where}: the object changed since it was listed, or already exists")
        if code == "ConditionalRequestConflict":
            return PreconditionFailedError(f"{where}: another write of the object was under way")
        if code == "NoSuchBucket":
            return InvalidRootError(f"bucket {self.bucket_name!r} does not exist ({self.identity})")
        if code in _REJECTED or status == 401:
            return StoragePermissionError(f"{where}: the credentials were rejected ({code}): {_CREDENTIALS_HELP}")
        if status == 403:
            return StoragePermissionError(
                f"{where}: permission denied ({code}); grant the role s3:ListBucket on bucket {self.bucket_name} and "
                "s3:GetObject, s3:PutObject, s3:DeleteObject on its objects"
            )
        return StorageError(f"{where} failed: {without_userinfo(str(message))} ({code or status})")

    @contextlib.contextmanager
    def _translate(self, op: str, name: str) -> Iterator[None]:
        # The one place botocore's errors become ours. botocore's retries (retry_settings) already handled 503
        # SlowDown, 500s and dropped connections before anything reaches this point.
        where = f"{op} {name!r} in {self.url}"
        try:
            yield
        except ClientError as exc:
            raise self._error(where, exc) from exc
        except NoCredentialsError as exc:
            raise StorageError(f"{where}: no AWS credentials: {_CREDENTIALS_HELP}") from exc
        except (BotoConnectionError, HTTPClientError) as exc:  # refused, DNS, TLS, timeouts: after the retries
            said = without_userinfo(str(exc))
            raise StorageError(f"{where} failed: cannot reach S3 at {self.endpoint} ({said})") from exc
        except BotoCoreError as exc:
            raise StorageError(f"{where} failed: {without_userinfo(str(exc))}") from exc

    def _listed(self, item: dict[str, Any]) -> ObjectInfo:
        return ObjectInfo(item["Key"][len(self._base):], int(item.get("Size", 0)), _seconds(item["LastModified"]),
                          _etag(item))

    def _pages(self, prefix: str, recursive: bool) -> Iterator[list[dict[str, Any]]]:
        """The listing's pages' objects; common prefixes (folders, without ``recursive``) are left out."""
        paginator = self._client.get_paginator("list_objects_v2")
        params: dict[str, Any] = {"Bucket": self.bucket_name, "Prefix": prefix}
        if not recursive:
            params["Delimiter"] = "/"
        for page in paginator.paginate(**params):
            yield page.get("Contents", [])

    def iter_objects(self, prefix: str = "", *, recursive: bool = False) -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        with self._translate("list", prefix or "."):
            for items in self._pages(self._base + prefix, recursive):
                for item in items:
                    yield self._listed(item)

    def list_stats(self, suffixes: tuple[str, ...] = ()) -> list[Listed]:
        base = len(self._base)
        out: list[Listed] = []
        with self._translate("list", "."):
            for items in self._pages(self._base, False):
                for item in items:
                    name = item["Key"][base:]
                    if not suffixes or name.endswith(suffixes):
                        out.append((name, int(item.get("Size", 0)), _seconds(item["LastModified"]), _etag(item)))
        return out

    def _head(self, name: str) -> dict[str, Any] | None:
        with self._translate("stat", name):
            try:
                head: dict[str, Any] = self._client.head_object(Bucket=self.bucket_name, Key=self._key(name))
                return head
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise

    def stat(self, name: str) -> ObjectInfo | None:
        head = self._head(name)
        if head is None:
            return None
        return ObjectInfo(name, int(head.get("ContentLength", 0)), _seconds(head["LastModified"]), _etag(head))

    def _get(self, name: str, **params: Any) -> bytes | None:
        """The object's bytes (a range of them with ``Range``), or None if there is none."""
        got = self._get_with_answer(name, **params)
        return None if got is None else got[0]

    def _get_with_answer(self, name: str, **params: Any) -> tuple[bytes, dict[str, Any]] | None:
        """The object's bytes and the GET's answer (its headers), or None if there is none."""
        self.reads += 1
        with self._translate("read", name):
            try:
                answer = self._client.get_object(Bucket=self.bucket_name, Key=self._key(name), **params)
                body = answer["Body"]
                try:
                    # botocore hands back the bytes as stored, whatever their Content-Encoding; such an object is
                    # still not one jaxcache wrote, named as on the other stores.
                    self._as_stored(name, answer.get("ContentEncoding"))
                except EncodedObjectError:
                    body.close()  # its bytes unread: the connection goes, not back to the pool half read
                    raise
                data: bytes = body.read()  # botocore checks the length it was told
                return data, answer
            except ClientError as exc:
                if _missing(exc):
                    return None
                if _code(exc) == "InvalidRange":  # from past the end: the object is there, with nothing there
                    return b"", {}
                raise

    def read_range(self, name: str, offset: int, length: int) -> bytes | None:
        if length <= 0:
            return b"" if self.exists(name) else None
        return self._get(name, Range=f"bytes={offset}-{offset + length - 1}")

    def read(self, name: str) -> bytes | None:
        return self._get(name)

    def read_with_info(self, name: str) -> tuple[bytes, ObjectInfo] | None:
        # One request: the GET's headers name the version (ETag) of exactly the bytes it returned.
        got = self._get_with_answer(name)
        if got is None:
            return None
        data, answer = got
        return data, ObjectInfo(name, len(data), _seconds(answer["LastModified"]), _etag(answer))

    def read_chunks(self, name: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes] | None:
        head = self._head(name)
        if head is None:
            return None
        self._as_stored(name, head.get("ContentEncoding"))  # the ranges come from this version only (If-Match)
        return self._chunks(name, int(head.get("ContentLength", 0)), head["ETag"], chunk_bytes)

    def _chunks(self, name: str, size: int, etag: str, chunk_bytes: int) -> Iterator[bytes]:
        # Each range only from the version first seen (If-Match): a replaced object cannot splice into the bytes read.
        for start in range(0, size, chunk_bytes):
            end = min(start + chunk_bytes, size) - 1
            self.reads += 1
            with self._translate("read", name):
                try:
                    answer = self._client.get_object(Bucket=self.bucket_name, Key=self._key(name),
                                                     Range=f"bytes={start}-{end}", IfMatch=etag)
                    chunk: bytes = answer["Body"].read()
                except ClientError as exc:
                    if _missing(exc) or _status(exc) == 412:
                        raise self._replaced(name) from None
                    raise
            yield chunk

    def delete(self, name: str, *, if_version: str | None = None) -> bool:
        # S3 answers a DELETE of nothing as of something, so a HEAD first tells "already gone" apart; it also checks
        # the version just before the delete, which is then sent as If-Match: S3 refuses the delete if the object was
        # replaced in between, and a store that ignores If-Match leaves only the moment between the two requests.
        head = self._head(name)
        if head is None:
            return False
        etag = head.get("ETag")
        if if_version is not None and (etag is None or etag_token(etag) != if_version):
            raise PreconditionFailedError(f"delete {name!r} in {self.url}: the object changed since it was listed")
        try:
            with self._translate("delete", name):
                try:
                    self._delete(name, etag if self._conditional_deletes else None)
                except ClientError as exc:
                    if _missing(exc):
                        return False
                    if not (etag and _code(exc) == "NotImplemented"):
                        raise
                    # A store without conditional deletes that says so: the check above is all there is, from now on.
                    self._conditional_deletes = False
                    self._delete(name, None)
        except PreconditionFailedError:
            # If-Match fails on an object deleted since the HEAD as on one replaced: gone is "already deleted".
            if self._head(name) is None:
                return False
            raise
        return True

    def _delete(self, name: str, etag: str | None) -> None:
        self._client.delete_object(Bucket=self.bucket_name, Key=self._key(name), **({"IfMatch": etag} if etag else {}))

    def write_atomic(self, name: str, data: bytes, *, create_only: bool = False, if_version: str | None = None) -> None:
        # A PUT is atomic by itself: readers see the old object or the whole new one. If-None-Match: * creates only;
        # If-Match replaces only the version read (S3 answers 412 when another replaced it, 404 when it is gone).
        if create_only and if_version is not None:
            raise InvalidInputError("create_only and if_version exclude each other: a create has no earlier version")
        condition = {"IfNoneMatch": "*"} if create_only else {}
        with self._translate("write", name):
            if if_version is not None:
                condition = self._replace_condition(name, if_version)
            try:
                self._put(name, data, condition)
            except ClientError as exc:
                if if_version is not None and condition and _code(exc) == "NotImplemented":
                    # A store without conditional writes that says so: as for deletes, a check of the version just
                    # before the write is all there is, from now on.
                    self._conditional_writes = False
                    self._put(name, data, self._replace_condition(name, if_version))
                    return
                # botocore retries a PUT whose answer was lost; when that attempt had created the object, the retry's
                # 412 is about our own write. An object holding exactly our bytes means the create happened; anything
                # else (or nothing) there is someone else's doing. (Not for a replace: see Storage.write_atomic.)
                conflict = _status(exc) == 412 or _code(exc) == "ConditionalRequestConflict"
                if create_only and conflict and self.read(name) == data:
                    return
                if if_version is not None and _missing(exc):
                    raise PreconditionFailedError(f"replace {name!r} in {self.url}: the object was deleted since it "
                                                  "was read") from exc
                raise

    def _replace_condition(self, name: str, if_version: str) -> dict[str, str]:
        """What a PUT that replaces only the version ``if_version`` sends: If-Match, or, on a store that has none,
        nothing once a HEAD just before it saw that version."""
        if self._conditional_writes:
            return {"IfMatch": if_version}
        head = self._head(name)
        if head is None or etag_token(str(head.get("ETag", ""))) != if_version:
            raise PreconditionFailedError(f"replace {name!r} in {self.url}: the object was replaced or deleted since "
                                          "it was read")
        return {}

    def _put(self, name: str, data: bytes, condition: dict[str, str]) -> None:
        self._client.put_object(Bucket=self.bucket_name, Key=self._key(name), Body=data,
                                ContentType="application/octet-stream", **condition)

def _etag(item: dict[str, Any]) -> str | None:
    """The version token of a listed object, a HEAD or a GET: its ETag, quoted as headers carry it."""
    etag = item.get("ETag")
    return etag_token(etag) if etag else None


def _seconds(when: Any) -> float:
    """A Last-Modified as whole seconds: a listing gives milliseconds where a HEAD gives seconds."""
    return float(int(when.timestamp()))
