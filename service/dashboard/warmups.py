"""The warm-ups page's one boundary with warm-up coverage records (``jaxcache.coverage``; ``warmup`` writes them
under ``<root>/.jaxcache/warmups/<id>.json``).

This branch of the service does not ingest coverage records (``GET /v1/caches/{cache}/warmups`` lands
separately). Until it does, both functions answer None and the page says that no warm-up records are ingested.
Wiring them means returning what the API answers, as dicts with (at least) these fields:

- :func:`list_warmups`, one dict per warm-up, newest first: ``id``, ``job``, ``topology``, ``platform``,
  ``gpu_model`` (None on CPU), ``finished_at`` (Unix time), ``programs`` (how many it compiled or found),
  ``written``, ``present`` (already in the cache), ``not_written``, ``hit_since`` (how many of its programs jobs
  have hit since it finished);
- :func:`get_warmup`, the same for one warm-up plus ``program_list``: dicts of ``key``, ``function``, ``status``
  (written / present / not_written), ``compile_s``, ``size_bytes``, ``reason``, ``hits_since`` (reported hits
  since the warm-up finished) and ``in_cache`` (the entry is in the cache now).
"""

from __future__ import annotations

from typing import Any


def list_warmups(state: Any, cache: str) -> list[dict] | None:
    """The cache's warm-ups, newest first; None while the service ingests no coverage records."""
    return None


def get_warmup(state: Any, cache: str, warmup_id: str) -> dict | None:
    """One warm-up with its programs; None when it is unknown (or no coverage records are ingested)."""
    return None
