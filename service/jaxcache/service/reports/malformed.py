"""Records a rescan skips: counted, and logged once per rescan however many there are."""

from __future__ import annotations

import logging

from sqlalchemy.exc import DataError, IntegrityError

from jaxcache.display import shown
from jaxcache.errors import InvalidInputError, NotRegularFileError
from jaxcache.storage import ObjectInfo, Storage
from jaxcache.storage.base import name_problem
from jaxcache.units import plural

log = logging.getLogger("jaxcache.service")

#: A record's own fault (our schema's or a column's refusal); a database that is down is not caught.
REFUSALS = (InvalidInputError, DataError, IntegrityError)


def reason(exc: Exception) -> str:
    """Why a record was refused, in one line (the catalog's own message, not its statement)."""
    if isinstance(exc, DataError | IntegrityError):
        said = str(exc.orig).strip().splitlines() if exc.orig is not None else []
        return f"the catalog refused it: {said[0] if said else type(exc).__name__}"
    return str(exc)


class Skipped:
    def __init__(self, what: str) -> None:
        self.what = what
        self.found: list[tuple[str, str]] = []

    def add(self, name: str, why: str) -> None:
        self.found.append((name, why))
        log.debug("skipping malformed %s %s: %s", self.what, shown(name), why)

    def log(self, cache: str) -> None:
        if not self.found:
            return
        name, why = self.found[0]
        more = f" and {len(self.found) - 1} more" if len(self.found) > 1 else ""
        log.warning("cache %s: skipped %s, each read again only once it changes: %s: %s%s",
                    cache, plural(len(self.found), f"malformed {self.what}"), shown(name), why, more)

    def __len__(self) -> int:
        return len(self.found)


def read_file(storage: Storage, info: ObjectInfo, max_bytes: int) -> tuple[bytes | None, str | None]:
    """A record file's bytes, or why it is skipped; (None, None) when deleted since the listing."""
    problem = name_problem(info.name)
    if problem is not None:
        return None, problem
    if info.size_bytes > max_bytes:
        return None, f"larger than {max_bytes} bytes"
    try:
        return storage.read(info.name), None
    except NotRegularFileError as exc:
        return None, f"not a regular file: {exc}"

