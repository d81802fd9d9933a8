"""A few daemon threads working through a queue, each call's answer a :class:`concurrent.futures.Future`: for work that
waits on a store, which must never hold the interpreter's exit. A ``concurrent.futures`` pool's threads are joined at
exit, after running everything still queued: a job whose working set was still being fetched at its end would wait
for all of it, on a store that stopped answering for minutes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class DaemonPool:
    """Up to ``workers`` daemon threads, started as work comes; :meth:`close` lets them end once the queue is empty."""

    def __init__(self, workers: int, name: str) -> None:
        self._most = max(1, workers)
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every thread now (for work that may come at interpreter exit, where Python >= 3.12 starts none)."""
        with self._lock:
            while self._threads < self._most:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        """Run ``call()`` on one of the threads; its future (cancelled while queued: it never runs)."""
        future: Future[T] = Future()
        self._queue.put((future, call))
        with self._lock:
            if self._threads < self._most:
                self._threads += 1
                threading.Thread(target=self._work, name=f"{self._name}-{self._threads}", daemon=True).start()
        return future

    def close(self) -> None:
        """No more work: each thread ends once the queue is empty."""
        with self._lock:
            for _ in range(self._threads):
                self._queue.put(None)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                future.set_exception(exc)
