"""How each background loop is doing: its last success and last error (``/readyz``, metrics), the wait before
its next round (backoff while it fails), and logging that says each kind of error once instead of every round."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy.exc import DBAPIError, OperationalError

from jaxcache.errors import JaxcacheError
from jaxcache.service.metrics import Metrics

log = logging.getLogger("jaxcache.service")

#: The first retry after an error; each further failure doubles it, up to the loop's period.
BACKOFF_FIRST_S = 1.0


@dataclass(frozen=True, slots=True)
class LoopStatus:
    """One loop as ``/readyz`` shows it. ``failures``: rounds failed in a row (0 once a round succeeds)."""

    last_success_s: float | None = None
    last_error: str | None = None
    last_error_s: float | None = None
    failures: int = 0


class LoopHealth:
    """Shared by the loops (asyncio tasks whose rounds run in worker threads) and the routes that read it."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self._loops: dict[str, LoopStatus] = {}
        self._logged: dict[str, set[str]] = {}  # loop -> kinds of error logged since it last succeeded
        # Told every change (the leader of several workers publishes it to the others: see workers.py).
        self.on_change: Callable[[dict[str, LoopStatus]], None] | None = None

    def succeeded(self, loop: str) -> None:
        now = time.time()
        with self._lock:
            before = self._loops.get(loop, LoopStatus())
            self._loops[loop] = replace(before, last_success_s=now, failures=0)
            self._logged.pop(loop, None)
        if before.failures:
            log.info("background %s recovered after %d failed round(s); last error: %s", loop, before.failures,
                     before.last_error)
        self._metrics.loop_last_success.labels(loop).set(now)
        self._metrics.loop_failing.labels(loop).set(0)
        self._changed()

    def failed(self, loop: str, exc: BaseException, where: str = "") -> None:
        """Note one failed round (or one cache's part of it, ``where``); log the first error of each kind."""
        kind = f"{where}:{type(exc).__name__}" if where else type(exc).__name__
        said = describe(exc)
        message = f"{where}: {said}" if where else said
        with self._lock:
            before = self._loops.get(loop, LoopStatus())
            self._loops[loop] = replace(before, last_error=message[:2000], last_error_s=time.time(),
                                        failures=before.failures + 1)
            first = kind not in self._logged.setdefault(loop, set())
            self._logged[loop].add(kind)
        self._metrics.loop_errors.labels(loop, type(exc).__name__).inc()
        self._metrics.loop_failing.labels(loop).set(1)
        self._changed()
        if first:
            # Our own errors carry a message to act on, as does a database that is down; anything else is a bug:
            # its traceback helps.
            expected = isinstance(exc, JaxcacheError | OperationalError)
            log.error("background %s failed: %s (retrying with backoff; this is logged once until it recovers)",
                      loop, message, exc_info=None if expected else exc)
        else:
            log.debug("background %s failed again: %s", loop, message)

    def wait_s(self, loop: str, period_s: float) -> float:
        """Seconds until the loop's next round: its period, or a doubling backoff while its rounds fail."""
        failures = self.status(loop).failures
        if not failures:
            return period_s
        return min(period_s, BACKOFF_FIRST_S * 2 ** min(failures - 1, 30))

    def status(self, loop: str) -> LoopStatus:
        with self._lock:
            return self._loops.get(loop, LoopStatus())

    def snapshot(self) -> dict[str, LoopStatus]:
        with self._lock:
            return dict(self._loops)

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.snapshot())
            except OSError as exc:  # the other workers' /readyz shows an older status; the loop goes on
                log.warning("could not publish the background loops' status: %s", exc)


def describe(exc: BaseException) -> str:
    """One line on an error: for the database's, what the server said (not the statement and its parameters)."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        said = str(exc.orig).strip().splitlines()
        return f"catalog database: {said[0] if said else type(exc.orig).__name__}"
    text = str(exc).strip()
    return text.splitlines()[0][:1000] if text else type(exc).__name__
