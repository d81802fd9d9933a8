"""Real S3 and Azure Blob protocol servers for the tests, started once per session (per pytest-xdist process) as
conftest's ``fake_gcs`` is: moto's S3 server (``moto[server]``, from PyPI) and Azurite's blob service (npm;
``make test`` installs it under ``.node/`` and passes it as ``JAXCACHE_AZURITE``). Without one, its tests skip and
say why.

While a server runs, the environment points the stores' own client libraries at it, as the user's environment points
them at a real store: ``AWS_ENDPOINT_URL`` and test credentials for boto3 (and s3fs), the emulator's well-known
account in ``AZURE_STORAGE_CONNECTION_STRING`` for azure-storage-blob (and adlfs).
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
from collections.abc import Iterator
from pathlib import Path

import pytest

from ports import free_port

REPO = Path(__file__).resolve().parent.parent
#: Where `make test` installs Azurite (npm install --prefix .node azurite@...).
DEFAULT_AZURITE = REPO / ".node" / "node_modules" / ".bin" / "azurite-blob"
#: Azurite's well-known development account (its documentation publishes the key).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

# What a developer's own environment may say about AWS or Azure that would lead the tests' clients elsewhere.
_AWS_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION",
            "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED", "AWS_RETRY_MODE",
            "AWS_MAX_ATTEMPTS", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")
_AZURE_ENV = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
              "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_ID", "AZURE_STORAGE_CLIENT_SECRET",
              "AZURE_STORAGE_TENANT_ID", "AZURE_STORAGE_ANON")


@contextlib.contextmanager
def environment(names: tuple[str, ...], values: dict[str, str]) -> Iterator[None]:
    """``names`` unset but for ``values``, for as long as the block runs; then as they were."""
    old = {k: os.environ.get(k) for k in names}
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


def _serve(cmd: list[str], probe: str, what: str, cwd: Path) -> subprocess.Popen:
    """Start ``cmd`` and wait until ``probe`` answers anything over HTTP (a bound on waiting, not a timing test)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
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
                said = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                raise RuntimeError(f"{what} did not start: {said}") from None
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- moto's S3 server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory) -> Iterator[str]:
    """moto's S3 server on a free loopback port, for the whole session; boto3 clients created meanwhile reach it
    (``AWS_ENDPOINT_URL``, test credentials, no profile files, no instance metadata)."""
    binary = Path(sys.executable).with_name("moto_server")
    if not binary.exists():
        pytest.skip("moto's S3 server is not installed: pip install 'moto[server]' (the dev group has it)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = tmp_path_factory.mktemp("moto")
    proc = _serve([str(binary), "-H", "127.0.0.1", "-p", str(port)], f"{url}/", "moto_server", folder)
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(folder / "no-config"), "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-credentials")}
    try:
        with environment(_AWS_ENV, env):
            yield url
    finally:
        _stop(proc)


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


def azurite_connection_string(blob_url: str) -> str:
    """The connection string of Azurite's development account at ``blob_url`` (its scheme, host and port)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={blob_url}/{AZURITE_ACCOUNT};")


@pytest.fixture(scope="session")
def azurite(tmp_path_factory) -> Iterator[str]:
    """Azurite's blob service (in memory, on a free loopback port) for the whole session; azure-storage-blob clients
    created meanwhile reach it through ``AZURE_STORAGE_CONNECTION_STRING``. Yields its base URL."""
    binary = Path(os.environ.get("JAXCACHE_AZURITE") or DEFAULT_AZURITE)
    if not binary.exists():
        pytest.skip(f"no Azurite at {binary}: `make test` installs it with npm (Node from Debian where it is "
                    "missing); or set JAXCACHE_AZURITE to an azurite-blob")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # --skipApiVersionCheck: azure-storage-blob may be newer than the Azurite release pinned.
    cmd = [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--silent",
           "--skipApiVersionCheck", "--disableTelemetry"]
    try:
        proc = _serve(cmd, f"{url}/{AZURITE_ACCOUNT}?comp=list", "azurite-blob", tmp_path_factory.mktemp("azurite"))
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"Azurite at {binary} did not start ({exc}): the Azure tests need Node.js on PATH")
    try:
        with environment(_AZURE_ENV, {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(url)}):
            yield url
    finally:
        _stop(proc)


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


def raw_put(root: str, name: str, data: bytes) -> None:
    """Write ``data`` as the object ``name`` under the object-store root ``root`` with the store's own client library,
    whatever the name: what a writer past jaxcache's name checks can leave there."""
    scheme, bucket, prefix = _split(root)
    key = f"{prefix}/{name}" if prefix else name
    if scheme == "gs":
        from google.cloud import storage

        storage.Client().bucket(bucket).blob(key).upload_from_string(data)
    elif scheme == "s3":
        import boto3

        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    else:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        service.get_blob_client(bucket, key).upload_blob(data, overwrite=True)


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
