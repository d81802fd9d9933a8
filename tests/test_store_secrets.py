"""Secrets in a store's URL (#72 item 3): a user and password in ``AWS_ENDPOINT_URL``, in a connection string's
``BlobEndpoint`` or in ``STORAGE_EMULATOR_HOST`` never show: not in the CLI's errors (where the store's library
names the URL it asked), not in the service's ``GET /v1/caches`` (``last_scan_error``), its dashboard or its log.
Account keys and SAS tokens never showed; a test keeps it so."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import httpx
import pytest

from conftest import serve_env, start_serve, stop_serve
from ports import free_port
from store_servers import _AWS_ENV, _AZURE_ENV, _GCS_ENV, AZURITE_ACCOUNT, AZURITE_KEY

USER, PASSWORD = "alice-do-not-print", "pw-5e1c9-do-not-print"
SIG = "sig-3b7a0-do-not-print"
READ = "s-read"


def _env(**store: str) -> dict[str, str]:
    """This environment without any store's settings (nor jaxcache's), plus ``store``'s; few, quick retries."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*_AWS_ENV, *_GCS_ENV, *_AZURE_ENV) and not k.startswith("JAXCACHE_")}
    return {**env, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1",
            "JAXCACHE_GCS_RETRY_DEADLINE_S": "1", "JAXCACHE_AZURE_RETRY_DELAY_S": "0.1", **store}


def _azure(endpoint: str, *, sas: bool = False) -> str:
    if sas:  # what a SAS token's connection string holds: the endpoint and the token, no account key
        return f"BlobEndpoint={endpoint};SharedAccessSignature=sv=2024-01-01&ss=b&srt=sco&sp=rl&sig={SIG}"
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint};")


def _jaxcache(*args: str, **env: str) -> str:
    """What `jaxcache ARGS` said, once it ended as for bad input: exit 2, one line, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "jaxcache", *args], capture_output=True, text=True, timeout=120,
                          env=_env(**env))
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in said and proc.stderr.count("\n") == 1, said
    return said


STORES = {
    "s3": lambda url: ("s3://bucket/cache", {"AWS_ENDPOINT_URL": url}),
    "az": lambda url: ("az://container/cache", {"AZURE_STORAGE_CONNECTION_STRING": _azure(url + "/devstoreaccount1")}),
    "gs": lambda url: ("gs://bucket/cache", {"STORAGE_EMULATOR_HOST": url}),
}


@pytest.mark.parametrize("store", list(STORES))
def test_a_cli_error_names_the_endpoint_without_its_user_and_password(store):
    """A store that cannot be reached: the error names its endpoint, as the store's library does (botocore's
    text names the whole URL it asked), without the user and password."""
    port = free_port()  # nothing listens there
    root, env = STORES[store](f"http://{USER}:{PASSWORD}@127.0.0.1:{port}")
    # One try: the libraries' retries of a refused connection only delay the same error (Azure's, 20 s).
    said = _jaxcache("ls", root, **env, JAXCACHE_AZURE_RETRIES="0", AWS_MAX_ATTEMPTS="1")
    assert f"http://127.0.0.1:{port}" in said, said
    for secret in (USER, PASSWORD, AZURITE_KEY):
        assert secret not in said, said


@pytest.mark.parametrize("sas", [False, True], ids=["account key", "SAS token"])
def test_azure_errors_never_show_an_account_key_or_a_sas_token(azurite, sas):
    """Azurite answers (a container that does not exist, or a SAS token it refuses): the key and the token stay
    out of the error, as they always did."""
    said = _jaxcache("ls", "az://no-such-container/cache",
                     AZURE_STORAGE_CONNECTION_STRING=_azure(f"{azurite}/{AZURITE_ACCOUNT}", sas=sas))
    assert "no-such-container" in said and AZURITE_KEY not in said and SIG not in said, said


def test_the_service_never_shows_an_endpoints_user_and_password(tmp_path, moto_s3):
    """A root whose bucket does not exist, on an endpoint with a user and password in it: the rescan's error names
    the endpoint (in GET /v1/caches, on the dashboard, in the log) without them."""
    endpoint = moto_s3.replace("http://", f"http://{USER}:{PASSWORD}@")
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc, base = start_serve({"c": "s3://no-such-bucket/cache"}, f"sqlite:///{tmp_path / 'catalog.sqlite'}",
                                 env=serve_env({READ: "read"}, AWS_ENDPOINT_URL=endpoint), stdout=out)
        try:
            # Not ready (its root cannot be read), but answering: until the first background rescan's error shows. A
            # bound on waiting, not a timing test.
            headers, deadline, cache = {"Authorization": f"Bearer {READ}"}, time.monotonic() + 60, {}
            while not cache.get("last_scan_error") and time.monotonic() < deadline and proc.poll() is None:
                with contextlib.suppress(httpx.TransportError):
                    [cache] = httpx.get(f"{base}/v1/caches", headers=headers, timeout=30).json()["caches"]
                time.sleep(0.1)
            pages = [httpx.get(f"{base}{page}", headers=headers, timeout=30).text for page in ("/", "/caches/c")]
            answers = httpx.get(f"{base}/v1/caches", headers=headers, timeout=30).text
        finally:
            stop_serve(proc)
    error = cache["last_scan_error"] or ""
    assert "does not exist" in error and moto_s3.removeprefix("http://") in error, cache
    assert any(moto_s3.removeprefix("http://") in page for page in pages), pages  # the dashboard shows the error
    said = log.read_text()
    for text in (answers, *pages, said):
        assert USER not in text and PASSWORD not in text
    assert "does not exist" in said, said
