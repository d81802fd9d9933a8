"""Which configured cache a run record or a job is for, from the root as the job spells it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from jaxcache.errors import InvalidInputError
from jaxcache.records import RunRecord


def normal_dir(text: str) -> str | None:
    """A cache_dir or root URL as roots compare (``gs://b/p``, or a real path); None for anything else."""
    if text.startswith("gs://"):
        return text.rstrip("/")
    if text.startswith("file://"):
        text = text[len("file://") :]
    if not os.path.isabs(text):
        return None
    return os.path.realpath(text)


def roots_by_dir(urls: Mapping[str, str]) -> dict[str, list[str]]:
    """``{normalised root: [cache names]}`` for the configured caches (several names may share a root)."""
    out: dict[str, list[str]] = {}
    for name, url in urls.items():
        norm = normal_dir(url)
        if norm is not None:
            out.setdefault(norm, []).append(name)
    return out


def cache_for(record: RunRecord, roots: Mapping[str, list[str]]) -> str:
    """The configured cache ``record.cache_dir`` names; InvalidInputError (pass ``?cache=``) if none or several."""
    return cache_for_dir(record.cache_dir, roots)


def cache_for_dir(cache_dir: str | None, roots: Mapping[str, list[str]]) -> str:
    """The configured cache whose root is ``cache_dir`` (as a job spells it); see :func:`cache_for`."""
    norm = normal_dir(cache_dir) if cache_dir else None
    names = roots.get(norm, []) if norm is not None else []
    if len(names) == 1:
        return names[0]
    if not names:
        said = f"cache_dir {cache_dir!r}" if cache_dir else "no cache_dir"
        raise InvalidInputError(f"the record has {said}, which is not the root of any configured cache: "
                                "pass ?cache=NAME (GET /v1/caches lists them)")
    raise InvalidInputError(f"cache_dir {cache_dir!r} is the root of caches {', '.join(sorted(names))}: "
                            "pass ?cache=NAME")


def filed_elsewhere(cache_dir: str | None, cache: str, roots: Mapping[str, list[str]]) -> list[str]:
    """The other caches whose root ``cache_dir`` is: a record filed under ``cache`` that belongs elsewhere."""
    norm = normal_dir(cache_dir) if cache_dir else None
    names = roots.get(norm, []) if norm is not None else []
    return [] if cache in names else sorted(names)
