"""Run records out of the process: a JSON file under ``<root>/.jaxcache/runs/`` and, optionally, the service.

Both fail open. A training job must never stop or wait because its cache telemetry could not be written: each
failure is logged once as a warning and the job goes on. With a node-local tier the root is asked through the tier's
bounded calls (:mod:`jaxcache.client.root_calls`): not at all while it does not answer, and at exit within what is
left of the exit's bound (:attr:`RecordWriter.until`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

from jaxcache import working_set_index
from jaxcache.records import JOB, RunRecord
from jaxcache.storage import Storage, open_storage
from jaxcache.storage.base import ObjectInfo
from jaxcache.working_set_index import JobIndex

if TYPE_CHECKING:
    from jaxcache.client.root_calls import RootCalls

T = TypeVar("T")

log = logging.getLogger("jaxcache.client")

POST_TIMEOUT_S = 2.0


class RecordWriter:
    """Writes a process's run record to the cache root, atomically, replacing the previous version."""

    def __init__(self, cache_dir: str) -> None:
        self._cache_dir = cache_dir
        self._storage: Storage | None = None
        self._warned = False
        self._lock = threading.Lock()
        self._opening = threading.Lock()
        self._calls: RootCalls | None = None
        #: ``time.monotonic()`` by which its requests must be answered (the exit's bound), or None: a deadline each.
        self.until: float | None = None

    def storage(self) -> Storage:
        """The cache root (opened on first use: a store's client library loads only for its roots)."""
        with self._opening:  # one client for the process, whichever thread asks first
            if self._storage is None:
                self._storage = open_storage(self._cache_dir, must_exist=False)
            return self._storage

    def bind(self, calls: RootCalls) -> None:
        """Ask the root through the node-local tier's bounded calls from now on."""
        self._calls = calls

    def _ask(self, call: Callable[[Storage], T], what: str) -> T:
        if self._calls is None:
            return call(self.storage())
        return self._calls.ask(call, what=what, until=self.until)

    def stat(self, name: str) -> ObjectInfo | None:
        """An object's metadata in the root (None: not there)."""
        return self._ask(lambda root: root.stat(name), f"a stat of {name}")

    def sizes(self, keys: list[str], local: Storage | None = None) -> dict[str, int]:
        """Sizes of entries, for records that do not know them yet: from the node-local tier's copies (``local``:
        no request, and there before an upload lands), else from the root; missing ones are left out."""
        found: dict[str, int] = {}
        try:
            if local is not None:
                for key in keys:
                    info = local.stat(key + "-cache")  # JAX's entry name for a key
                    if info is not None:
                        found[key] = info.size_bytes
            for key in keys:
                info = None if key in found else self.stat(key + "-cache")
                if info is not None:
                    found[key] = info.size_bytes
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the job
            self._warn_once(f"could not read entry sizes from {self._cache_dir}: {exc}")
        return found

    def write(self, record: RunRecord, *, create_only: bool = False) -> bool:
        """Write (or rewrite) the record; False, with one warning per process, when the root refuses."""
        with self._lock:
            try:
                self._ask(lambda root: root.write_atomic(record.name, record.to_json(), create_only=create_only),
                          f"the write of {record.name}")
                return True
            except Exception as exc:  # noqa: BLE001
                self._warn_once(f"could not write the run record {record.name} under {self._cache_dir}: {exc}")
                return False

    def index(self, record: RunRecord) -> JobIndex | None:
        """Merge process 0's final record of a job's run into the job's working-set index in the root
        (:mod:`jaxcache.working_set_index`), which the job's next starts read; the index as it was read (what the
        job's earlier runs measured). None where the record adds nothing, or, with a warning, where it could not
        be merged."""
        if record.process_index != 0 or record.kind != JOB:
            return None  # adds nothing (working_set_index.add_run): no warning either
        try:
            return self._ask(lambda root: working_set_index.add_run(root, record),
                             "an update of the job's working-set index")
        except Exception as exc:  # noqa: BLE001 - a job's exit never fails for it
            log.warning("jaxcache: could not update job %s's working-set index %s under %s (%s); the job goes on, and"
                        " its next starts prefetch what the index said before", record.job,
                        working_set_index.index_name(record.job), self._cache_dir, exc)
            return None

    def read_index(self, job: str) -> JobIndex | None:
        """The job's working-set index as the root has it (one read); None where there is none or it cannot be read
        (said at DEBUG: only the seconds saved are at stake, said as the writer's time instead)."""
        try:
            return self._ask(lambda root: working_set_index.read_index(root, job), "a read of the job's index")
        except Exception as exc:  # noqa: BLE001 - telemetry must not break the job
            log.debug("jaxcache: could not read job %s's working-set index under %s: %s", job, self._cache_dir, exc)
            return None

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("jaxcache: %s (the job goes on; telemetry for this process may be incomplete)", message)


class ServiceReporter:
    """POSTs run records to ``<service_url>/v1/reports`` from a background thread, 2 s timeout, fail open."""

    def __init__(
        self, service_url: str, token: str | None, *, opener: Callable[..., AbstractContextManager[Any]] | None = None
    ) -> None:
        self.url = f"{service_url}/v1/reports"
        self._token = token
        self._warned = False
        self._thread: threading.Thread | None = None
        self._pending: bytes | None = None
        self._cond = threading.Condition()
        self._opener = opener
        self.sent = 0
        self.failed = 0

    def submit(self, body: bytes) -> None:
        """Queue the newest record; an older one not yet sent is superseded (records hold totals)."""
        with self._cond:
            self._pending = body
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="jaxcache-report", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # at interpreter exit Python >= 3.12 starts no threads: send it here
                    self._pending = None
                    inline = True
                else:
                    self._thread, inline = thread, False
            else:
                inline = False
            self._cond.notify()
        if inline:
            self._post(body)

    def drain(self, timeout_s: float = POST_TIMEOUT_S + 0.5) -> None:
        """Wait (bounded) for the queued record to be sent: used at exit."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is None, timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                body = self._pending
            assert body is not None
            self._post(body)
            with self._cond:
                if self._pending is body:
                    self._pending = None
                self._cond.notify_all()

    def _post(self, body: bytes) -> None:
        import urllib.error  # loaded on first send: most of a job's life never needs it
        import urllib.request

        request = urllib.request.Request(self.url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with (self._opener or urllib.request.urlopen)(request, timeout=POST_TIMEOUT_S) as response:
                response.read()
            self.sent += 1
        except urllib.error.HTTPError as exc:
            self.failed += 1
            detail = exc.read()[:300].decode(errors="replace")
            self._warn_once(f"the jaxcache service at {self.url} refused the run record: HTTP {exc.code} {detail}")
        except Exception as exc:  # noqa: BLE001 - URLError, timeouts, resets: the service is down or unreachable
            self.failed += 1
            self._warn_once(f"the jaxcache service at {self.url} is unreachable ({exc})")

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("jaxcache: %s; the job goes on, and run records are still written to the cache root",
                        message)


def ask_service(service_url: str, path: str, query: Mapping[str, Any], token: str | None, timeout_s: float, *,
                body: Any = None) -> Any:
    """The service's JSON answer to ``GET path?query`` (``POST path`` with ``body`` as JSON) with the job's bearer
    token (what a job asks at start); raises urllib's errors (``HTTPError`` carries the status)."""
    import urllib.parse  # loaded when asked: a job that asks nothing never needs it
    import urllib.request

    url = f"{service_url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    request = urllib.request.Request(url) if body is None else urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())
