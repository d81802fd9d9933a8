"""Where a job's end-of-run summary goes (``JAXCACHE_SUMMARY``): one line a plain script shows, like a test runner's
or a progress bar's last line, without the user configuring logging, and without turning on any library's logs.

``auto`` (the default): logged at INFO on ``jaxcache.client`` where the user's logging shows that (the ``jaxcache``
logger, or the root one, enabled for INFO with a handler), else written to stderr. ``stderr``: always written there.
``log``: only logged. ``off``: neither. Warm-ups and their checks say their own results: theirs is only logged.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Final, Literal

from jaxcache.errors import InvalidInputError

Where = Literal["auto", "stderr", "log", "off"]
WHERE: Final[tuple[Where, ...]] = ("auto", "stderr", "log", "off")
VARIABLE: Final = "JAXCACHE_SUMMARY"


def where(env: Mapping[str, str]) -> Where:
    """``JAXCACHE_SUMMARY`` as set (``auto`` when unset or empty); :class:`InvalidInputError` names the choices."""
    value = env.get(VARIABLE, "").strip().lower() or "auto"
    for choice in WHERE:
        if value == choice:
            return choice
    raise InvalidInputError(f"{VARIABLE}={env.get(VARIABLE)!r}: use one of {', '.join(WHERE)}")


def say(line: str, where: Where, log: logging.Logger, *, job: bool = True) -> None:
    """Say ``line`` at exit as ``where`` says (a warm-up's, ``job`` False, is only logged)."""
    if where == "off":
        return
    shown_by_logging = log.isEnabledFor(logging.INFO) and log.hasHandlers()
    if where == "log" or not job or (where == "auto" and shown_by_logging):
        log.info("%s", line)
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed or gone at exit: nothing to say it on
        pass
