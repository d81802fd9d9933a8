"""Where the dashboard's browser tests save screenshots, and the run's summary line that names the folder. A plugin
of its own (conftest.py lists it), light enough for a test to run pytest with it alone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

SCREENSHOTS = Path(os.environ.get("JAXCACHE_SCREENSHOTS") or Path(__file__).parent.parent / "bench" / "out"
                   / "screenshots")

#: When this run started, on the controller's clock (xdist's too): screenshots newer than it are this run's.
_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The folder of the screenshots this run took. Under xdist the workers take them and what they print never
    shows, so the controller looks in the folder for files written since the run started."""
    started = config.stash.get(_STARTED, None)
    if hasattr(config, "workerinput") or started is None or not SCREENSHOTS.is_dir():
        return
    taken = sum(p.stat().st_mtime >= started for p in SCREENSHOTS.glob("*.png"))
    if taken:
        terminalreporter.write_line(f"dashboard screenshots: {SCREENSHOTS} ({taken} taken by this run)")
