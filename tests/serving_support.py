"""What tests/test_service_serving.py and tests/test_service_storms.py share: calls held until the test releases
them, and requests posted from threads of their own. Nothing here measures a time: PATIENCE_S only bounds a wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest import settled
from jaxcache.service.app import create_app
from reports_support import H_REPORT, settings

#: Bound on waiting for a held request; the assertions never depend on it.
PATIENCE_S = 60


class Held:
    """Wraps a function so that calls wait until :meth:`release` (each call says it has begun)."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.released.wait(PATIENCE_S), "the test never released the held call"
        return self.real(*args, **kwargs)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def client(tmp_path, cache_copy) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path, {"demo": str(cache_copy)}))) as c:
        settled(c)
        yield c


class HeldOnce(Held):
    """The first call waits for :meth:`release`; the others go through at once. Every call's arguments kept."""

    def __init__(self, real: Callable[..., Any]) -> None:
        super().__init__(real)
        self.calls: list[tuple] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(args)
        if len(self.calls) == 1:
            return super().__call__(*args, **kwargs)
        return self.real(*args, **kwargs)


def post_in_thread(client: TestClient, record, out: dict) -> threading.Thread:
    def send() -> None:
        out[record.process_index] = client.post("/v1/reports?cache=demo", content=record.to_json(),
                                                headers={**H_REPORT, "content-type": "application/json"})

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def wait_for(condition: Callable[[], bool]) -> None:
    """Bound on waiting for the service's threads; not a timing assertion."""
    import time

    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, "the service never got there"
        time.sleep(0.01)


def post_held_then_together(client: TestClient, held: HeldOnce, recs: list,
                             meanwhile: Callable[[], bool] = lambda: True) -> dict[int, Any]:
    """POST the first record, whose batch ``held`` keeps, then the others, which queue behind it; release it once
    they all wait (and ``meanwhile`` holds); the answers by process index."""
    answers: dict[int, Any] = {}
    first = post_in_thread(client, recs[0], answers)
    assert held.entered.wait(PATIENCE_S)
    rest = [post_in_thread(client, r, answers) for r in recs[1:]]
    wait_for(lambda: len(client.app.state.jaxcache.reports) == len(rest))  # behind the writer, which holds the first
    assert meanwhile()
    held.release()
    for t in [first, *rest]:
        t.join(PATIENCE_S)
    return answers
