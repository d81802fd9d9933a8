"""Whether a root's store answers, asked with a deadline: the first request the CLI, warm-up and the service make of a
store, so that one that stopped answering, refuses connections or cannot be reached costs seconds, not the minutes
its library's retries take (each library bounds one request, then tries it again, ten times on S3).

Only the first answer is bounded. A store that answers slowly (throttling, a large listing) has answered: what
follows is its library's to retry and is never cut off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jaxcache.errors import UnreachableError
from jaxcache.storage.base import ObjectStore, Storage, env_seconds
from jaxcache.storage.deadline import within

#: The setting, and its default: seconds to wait for a store's first answer.
SETTING = "JAXCACHE_REACH_S"
# Room for a first answer's real costs several times over: a credential chain's first token (a workload identity's
# exchange, azure-identity trying its sources in turn: seconds), a TLS handshake, and a throttled request's first
# retries (botocore waits up to 1, then 2, then 4 s). Well under the minutes a silent store used to cost.
DEFAULT_S = 20.0
MOST_S = 600.0


def deadline_s() -> float:
    """The seconds ``JAXCACHE_REACH_S`` gives, else :data:`DEFAULT_S`; InvalidInputError for a value out of range."""
    return env_seconds(SETTING, "to wait for a store's first answer", MOST_S) or DEFAULT_S


def reach(storage: Storage, seconds: float | None = None, *, ping: Callable[[], object] | None = None) -> None:
    """Return once the root answers (``storage.ping()``, or ``ping``); raise what the ping raises (a StorageError
    saying why), or :class:`UnreachableError` naming the root and its endpoint once ``seconds`` (default
    :func:`deadline_s`) have passed without an answer. The ping goes on in the background past the deadline."""
    bound = deadline_s() if seconds is None else seconds
    started = time.monotonic()
    try:
        within(bound, ping or storage.ping, what=storage.identity)
    except UnreachableError as exc:
        if time.monotonic() - started < bound:  # the ping's own error, not the deadline
            raise
        raise UnreachableError(f"{exc}: check that the store is up and reachable from here ({SETTING} sets how "
                               "long to wait)") from None


def answering(storage: Storage) -> Storage:
    """``storage``, once its store answered (:func:`reach`): a command's first look at a root in an object store.
    A directory is returned as it is: its own errors say at once what is wrong."""
    if isinstance(storage, ObjectStore):
        reach(storage)
    return storage
