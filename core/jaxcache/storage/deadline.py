"""A call to a store bounded in time: past its deadline the caller goes on, and the call finishes (or not) on its own.

Each store's library bounds one request (its connect and read timeouts) but then retries it, so a store that stops
answering can hold a caller for minutes. A job, the CLI and the service each decide how long they may wait for an
answer; :func:`within` is that bound. The call runs on a daemon thread: one left waiting on a dead store never keeps
the interpreter from exiting (a ``concurrent.futures`` pool's threads are joined at exit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from jaxcache.errors import UnreachableError

T = TypeVar("T")


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


def within(seconds: float, call: Callable[[], T], *, what: str) -> T:
    """``call()``'s answer, or the exception it raised, if it ends within ``seconds``; else :class:`UnreachableError`
    saying that ``what`` (``"s3://bucket/cache at http://host:9000"``) did not answer in time."""
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        try:
            outcome.value = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            outcome.error = exc
        finally:
            outcome.done.set()

    threading.Thread(target=run, name="jaxcache-deadline", daemon=True).start()
    if not outcome.done.wait(seconds):
        raise UnreachableError(f"{what} did not answer within {seconds:g} s")
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]  # set whenever no error was
