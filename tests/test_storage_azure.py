"""What Azure Blob Storage does its own way, on Azurite through azure-storage-blob: ETags as versions, If-None-Match
creates, If-Match deletes and reads, the library's retries, and the errors a user meets (no account, rejected
credentials, no container).

Requests are watched through azure-core's own ``raw_request_hook`` on a client the test hands to AzureStorage; faults
come from tests/store_faults.py's proxy."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.storage.blob import BlobServiceClient

from jaxcache import signing
from jaxcache.cli import main
from jaxcache.errors import (
    InvalidInputError,
    InvalidRootError,
    PreconditionFailedError,
    StorageError,
    StoragePermissionError,
)
from jaxcache.storage import open_storage
from jaxcache.storage.azure import RETRY_DELAY_ENV, AzureStorage, retry_policy
from store_faults import AzureFaults
from store_servers import AZURITE_ACCOUNT, azurite_connection_string

pytestmark = pytest.mark.slow


def _watched(container: str, sent: list) -> AzureStorage:
    """The root ``az://container/c`` through a client that records each request's method, URL and headers."""

    def hook(request) -> None:
        http = request.http_request
        sent.append((http.method, http.url, dict(http.headers)))

    service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"],
                                                       raw_request_hook=hook)
    return AzureStorage(container, "c", service=service)


@pytest.fixture
def faults(azurite, monkeypatch) -> Iterator[AzureFaults]:
    """The fault proxy in front of Azurite, named by the connection string: clients created from now on go through
    it, retrying after 3 s (0.02 + 3^1) rather than the library's 18 s."""
    proxy = AzureFaults(azurite)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(proxy.url))
    monkeypatch.setenv(RETRY_DELAY_ENV, "0.02")
    try:
        yield proxy
    finally:
        proxy.close()


def test_a_create_whose_answer_was_lost_is_accepted(faults, azure_service, azure_container):
    """Azurite creates the blob, the answer is lost, the library sends the Put again and Azure answers 409: the blob
    holds exactly our bytes, so the create happened. Someone else's bytes there are still refused."""
    storage = open_storage(f"az://{azure_container}/c")
    faults.drop(1, method="PUT")
    storage.write_atomic("k-cache", b"ours", create_only=True)
    assert [e[2] for e in faults.log if e[0] == "PUT"] == ["dropped", 409]
    assert azure_service.get_blob_client(azure_container, "c/k-cache").download_blob().readall() == b"ours"
    with pytest.raises(PreconditionFailedError):
        storage.write_atomic("k-cache", b"theirs", create_only=True)


def test_delete_of_a_replaced_blob_is_refused_by_azure(azure_container):
    sent: list = []
    storage = _watched(azure_container, sent)
    storage.write_atomic("e-cache", b"v1")
    listed = storage.stat("e-cache")
    storage.write_atomic("e-cache", b"v2")
    sent.clear()
    with pytest.raises(PreconditionFailedError, match="changed since it was listed"):
        storage.delete("e-cache", if_version=listed.version)
    # Azure's check, then a HEAD that tells a replaced blob from a deleted one (If-Match fails on both).
    assert [(m, h.get("If-Match")) for m, _, h in sent] == [("DELETE", listed.version), ("HEAD", None)]
    assert storage.read("e-cache") == b"v2"
    assert storage.delete("e-cache", if_version=storage.stat("e-cache").version) is True
    assert storage.read("e-cache") is None


def test_a_signature_object_is_read_with_one_bounded_ranged_get(azure_container):
    """A `-sig` object is read up to signing.MAX_SIG_BYTES + 1, however large it is: one GET with a range."""
    sent: list = []
    storage = _watched(azure_container, sent)
    storage.write_atomic(signing.sig_name("k"), os.urandom(1 << 20))
    sent.clear()
    data = signing.read_object(storage, "k")
    assert len(data) == signing.MAX_SIG_BYTES + 1
    [(method, _, headers)] = sent
    assert method == "GET" and headers["x-ms-range"] == f"bytes=0-{signing.MAX_SIG_BYTES}"


def test_server_busy_and_server_errors_are_retried_by_the_library(faults, azure_container):
    storage = open_storage(f"az://{azure_container}/c")
    for i in range(3):
        storage.write_atomic(f"k{i}-cache", b"x" * 100)
    # ServerBusy, Azure Storage's throttling, and a 500, at once: each retry waits 3 s here.
    faults.fail(1, 503, path=r"comp=list")
    faults.fail(1, 500, method="GET", path=r"/k1-cache")
    with ThreadPoolExecutor(2) as pool:
        listed = pool.submit(lambda: [o.name for o in storage.iter_objects()])
        read = pool.submit(storage.read, "k1-cache")
        assert listed.result() == ["k0-cache", "k1-cache", "k2-cache"] and read.result() == b"x" * 100
    assert faults.pending() == 0 and len(faults.injected()) == 2


def test_retries_are_the_librarys_policy(monkeypatch):
    monkeypatch.delenv(RETRY_DELAY_ENV, raising=False)
    assert retry_policy() is None  # azure-storage-blob's own ExponentialRetry (15 + 3^n s)
    monkeypatch.setenv(RETRY_DELAY_ENV, "0.5")
    policy = retry_policy()
    assert policy is not None and policy.initial_backoff == 0.5 and policy.total_retries == 3
    monkeypatch.setenv(RETRY_DELAY_ENV, "soon")
    with pytest.raises(InvalidInputError, match=RETRY_DELAY_ENV):
        retry_policy()


def test_no_account_is_one_clear_error(azurite, azure_container, monkeypatch, capsys):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    with pytest.raises(StorageError, match="no Azure storage account for az://.*AZURE_STORAGE_CONNECTION_STRING"):
        open_storage(f"az://{azure_container}/c")
    assert main(["ls", f"az://{azure_container}/c"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxcache: error: no Azure storage account") and err.count("\n") == 1


def test_a_connection_string_that_is_none(azurite, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "not one")
    with pytest.raises(InvalidInputError, match="AZURE_STORAGE_CONNECTION_STRING is not a connection string"):
        open_storage("az://container/c")


def test_rejected_credentials_say_so(azurite, azure_container, monkeypatch):
    wrong = azurite_connection_string(azurite).replace("AccountKey=Eby8", "AccountKey=Xby8")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", wrong)
    with pytest.raises(StoragePermissionError, match="permission denied.*check the credentials"):
        list(open_storage(f"az://{azure_container}/c").iter_objects())


def test_a_container_that_does_not_exist(azurite, capsys):
    url = f"az://no-such-container-{uuid.uuid4().hex[:8]}/x"
    storage = open_storage(url)
    for op in (lambda: list(storage.iter_objects()), lambda: storage.read("k-cache"),
               lambda: storage.stat("k-cache"), lambda: storage.delete("k-cache")):
        with pytest.raises(InvalidRootError, match="does not exist"):
            op()
    assert main(["ls", url]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_account_endpoint_is_part_of_the_identity(azurite, azure_container):
    storage = open_storage(f"az://{azure_container}/c")
    assert storage.identity == f"az://{azure_container}/c at {azurite}/{AZURITE_ACCOUNT}"
