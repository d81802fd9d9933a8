"""Timeouts on every request of every store (#71 item 3, the store part): with a store that stops answering
(connections accepted, nothing sent back), a job's first lookup on s3:// was still waiting after 420 s and on az://
after 300 s: botocore waits 60 s for a read and tries 10 times, azure-core 300 s (the transport jaxcache hands it
keeps those), google-cloud-storage 60 s. JAXCACHE_STORE_TIMEOUT_S now bounds each connect and each wait for bytes,
through each library's own settings, whose retry policies stay as they were."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from store_servers import _AWS_ENV, _AZURE_ENV, _GCS_ENV, azurite_connection_string

#: stat, read and list at once against the silent store, each ending as it may: what each raised, by name.
PROBE = """
import json, sys, threading
from jaxcache.errors import StorageError
from jaxcache.storage import open_storage

storage = open_storage(sys.argv[1])
ops = {"stat": lambda: storage.stat("k-cache"), "read": lambda: storage.read("k-cache"),
       "list": lambda: list(storage.iter_objects())}
ended = {}

def run(name, op):
    try:
        op()
        ended[name] = "answered"
    except StorageError as exc:
        ended[name] = f"StorageError: {exc}"
    except Exception as exc:
        ended[name] = repr(exc)

threads = [threading.Thread(target=run, args=item) for item in ops.items()]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(ended))
"""

#: Far above what a probe takes with 1 s timeouts and few tries (a few seconds), and below what it took with the
#: libraries' own timeouts (60 s and more a try): a watchdog, not a timed assertion.
WATCHDOG_S = 50


@pytest.fixture
def silent() -> Iterator[str]:
    """A loopback endpoint that accepts every connection and never answers: a store whose process stopped."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


STORES = {
    "s3": lambda url: ("s3://bucket/cache", {
        "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "2"}),
    "az": lambda url: ("az://container/cache", {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(url),
                                                "JAXCACHE_AZURE_RETRY_DELAY_S": "0.1", "JAXCACHE_AZURE_RETRIES": "1"}),
    "gs": lambda url: ("gs://bucket/cache", {"STORAGE_EMULATOR_HOST": url, "JAXCACHE_GCS_RETRY_DEADLINE_S": "2"}),
}


@pytest.mark.parametrize("scheme", list(STORES))
def test_stat_read_and_list_on_a_store_that_stopped_answering_end_in_a_storage_error(scheme, silent):
    root, store_env = STORES[scheme](silent)
    env = {k: v for k, v in os.environ.items()
           if k not in (*_AWS_ENV, *_GCS_ENV, *_AZURE_ENV) and not k.startswith("JAXCACHE_")}
    proc = subprocess.run([sys.executable, "-c", PROBE, root], capture_output=True, text=True, timeout=WATCHDOG_S,
                          env={**env, **store_env, "JAXCACHE_STORE_TIMEOUT_S": "1"})
    assert proc.returncode == 0, proc.stderr
    ended = json.loads(proc.stdout)
    assert set(ended) == {"stat", "read", "list"}, ended
    assert all(why.startswith("StorageError: ") for why in ended.values()), ended
