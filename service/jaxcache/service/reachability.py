"""Whether each cache's root answers, as this process last saw it. A root is looked at (its ``ping``, bounded by
:func:`jaxcache.reach.reach`'s deadline) in the background once the app serves, again when asked about while its
last look is over :data:`FRESH_S` old, and before each rescan; never twice at once: while a look's ping has not
ended (a store that stopped answering holds it for its library's retries), the next look is that one's outcome.
So nothing waits on a silent store for longer than the deadline, and readiness, the API and the dashboard say which
root cannot be reached, since when and why. docs/service.md, "Roots that do not answer"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from jaxcache.errors import UnreachableError
from jaxcache.reach import reach
from jaxcache.storage import Storage

log = logging.getLogger("jaxcache.service")

#: A look older than this is taken again when someone asks (readiness, the caches' list, the dashboard).
FRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class Reach:
    """A root as this process last saw it: ``reachable`` None until its first look ends."""

    reachable: bool | None = None
    since_s: float | None = None  # when the looks began to fail (null while it answers)
    error: str | None = None  # why the last look failed, one line
    looked_s: float | None = None  # when the last look ended (or ran past the deadline)


class _Look:
    """One ping of a root: ``decided`` once it answered, failed or ran past the deadline; ``ended`` once the ping
    itself returned (it may go on past the deadline)."""

    def __init__(self) -> None:
        self.decided, self.ended = threading.Event(), threading.Event()
        self.answered = False  # the ping ended (an answer or an error): the deadline's outcome comes too late


class Reachability:
    """The caches' roots, each with how it answered its last look. Thread-safe."""

    def __init__(self, storages: Mapping[str, Storage], deadline_s: float) -> None:
        self.storages, self.deadline_s = storages, deadline_s
        self._lock = threading.Lock()
        self._reach: dict[str, Reach] = {}
        self._errors: dict[str, Exception] = {}
        self._looks: dict[str, _Look] = {}

    def of(self, name: str) -> Reach:
        with self._lock:
            return self._reach.get(name, Reach())

    def fresh(self, name: str) -> Reach:
        """How ``name``'s root answered its last look; a new look starts in the background when that one is older
        than :data:`FRESH_S` (its outcome is for the next ask: this never waits)."""
        found = self.of(name)
        if found.looked_s is None or time.time() - found.looked_s > FRESH_S:
            self._look(name)
        return found

    def look_all(self) -> None:
        """Look at every root in the background (at start: what is found is logged, and shown when asked)."""
        for name in self.storages:
            self._look(name)

    def check(self, name: str) -> None:
        """Look at ``name``'s root now (or take the look under way), waiting at most the deadline; raise why it
        cannot be reached (the store's error, or :class:`UnreachableError`), else return."""
        self._look(name).decided.wait()
        with self._lock:
            error = self._errors.get(name)
        if error is not None:
            raise error.with_traceback(None)

    def _look(self, name: str) -> _Look:
        """The look at ``name``'s root under way, or a new one started in the background."""
        with self._lock:
            look = self._looks.get(name)
            if look is not None and not look.ended.is_set():
                return look
            look = self._looks[name] = _Look()
        threading.Thread(target=self._looking, args=(name, look), name=f"jaxcache-reach-{name}", daemon=True).start()
        return look

    def _looking(self, name: str, look: _Look) -> None:
        storage = self.storages[name]

        def ping() -> None:
            try:
                storage.ping()
            except Exception as exc:  # noqa: BLE001 - whatever stops the ping, the root is not usable now
                self._noted(name, look, exc)
            else:  # also once a store that stopped answering answers a ping that outlived its deadline
                self._noted(name, look, None)
            finally:
                look.ended.set()

        try:
            reach(storage, self.deadline_s, ping=ping)
        except UnreachableError as exc:  # the deadline passed; the ping notes how it ends, if it ever does
            self._noted(name, look, exc, deadline=True)
        finally:
            look.decided.set()

    def _noted(self, name: str, look: _Look, error: Exception | None, *, deadline: bool = False) -> None:
        now = time.time()
        with self._lock:
            if deadline and look.answered:  # the ping ended just as the deadline passed: its outcome stands
                return
            look.answered = look.answered or not deadline
            before = self._reach.get(name, Reach())
            if error is None:
                self._errors.pop(name, None)
                after = Reach(reachable=True, looked_s=now)
            else:
                self._errors[name] = error
                since = before.since_s if before.reachable is False else now
                after = Reach(reachable=False, since_s=since, error=_line(error), looked_s=now)
            self._reach[name] = after
        url = self.storages[name].url
        if error is not None and before.reachable is not False:
            log.warning("cache %r: %s cannot be reached: %s. It is served from the catalog meanwhile, and rescanned "
                        "once it answers", name, url, after.error)
        elif error is None and before.reachable is False:
            log.warning("cache %r: %s answers again, after %.0f s", name, url, now - (before.since_s or now))


def _line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:1000] if text else type(error).__name__
