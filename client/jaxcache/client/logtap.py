"""A filter on JAX's cache loggers that reads every record and lets through only what the user saw before."""

from __future__ import annotations

import logging
from collections.abc import Callable


class LogTap(logging.Filter):
    """A filter on JAX's cache loggers: reads every record, lets through only what was visible before."""

    def __init__(self, reader: Callable[[logging.LogRecord], None], passthrough_level: int) -> None:
        super().__init__()
        self._reader = reader
        self._passthrough_level = passthrough_level

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._reader(record)
        except Exception:  # noqa: BLE001 - telemetry must never break a compile
            pass
        return record.levelno >= self._passthrough_level
