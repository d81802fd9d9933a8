"""What kind of request each logged request to a store was, read off the HTTP request alone (as a proxy in front of
the store sees it, tests/gcs_faults.py's log), so whatever client made it is counted the same way: jaxcache's tier
through the store's own library, plain JAX through fsspec (s3fs, gcsfs, adlfs).

Kinds: ``list`` (a listing page), ``head`` (an object's metadata: S3 and Azure HEAD, a GCS JSON-API object GET
without ``alt=media``), ``get`` (an object's bytes), ``put`` (an upload, any part of one), ``other`` (bucket
metadata, deletes, anything else). Listings and gets are also told apart by what they are for: the cache's entries,
jaxcache's records (``.jaxcache/``) or a pack (``.jaxcache/packs/``: its stat and its ranged reads), the counts in
:data:`DETAILS`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from urllib.parse import parse_qs, unquote, urlsplit

KINDS = ("list", "head", "get", "put", "other")
#: Finer counts beside :data:`KINDS`: listings of the records' prefixes, gets of records, gets of entries, a pack's
#: stats and its (ranged) gets.
DETAILS = ("list_records", "get_records", "get_entries", "head_pack", "get_pack")
RECORDS_MARK = ".jaxcache/"
PACKS_MARK = ".jaxcache/packs/"


def classify(scheme: str, method: str, raw_path: str) -> tuple[str, str | None]:
    """``(kind, detail)`` of one request to a store of ``scheme`` (``s3``, ``gs``, ``az``); ``detail`` is one of
    :data:`DETAILS` or None."""
    split = urlsplit(raw_path)
    query = parse_qs(split.query, keep_blank_values=True)
    path = unquote(split.path)
    if scheme == "s3":
        kind, name, prefix = _s3(method, path, query)
    elif scheme == "gs":
        kind, name, prefix = _gs(method, path, query)
    elif scheme == "az":
        kind, name, prefix = _az(method, path, query)
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    if kind == "list":
        return kind, "list_records" if RECORDS_MARK in (prefix or "") else None
    if PACKS_MARK in name and kind in ("head", "get"):
        return kind, f"{kind}_pack"
    if kind == "get":
        return kind, ("get_records" if RECORDS_MARK in name else "get_entries" if name.endswith("-cache") else None)
    return kind, None


def _first(query: dict[str, list[str]], name: str) -> str:
    return query.get(name, [""])[0]


def _s3(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, str, str | None]:
    # Path-style addressing (the endpoint is an IP address): /bucket[/key].
    _bucket, _, key = path.lstrip("/").partition("/")
    if not key:
        if method == "GET" and ("list-type" in query or "prefix" in query or "delimiter" in query or not query):
            return "list", "", _first(query, "prefix")
        return "other", "", None
    if method == "HEAD":
        return "head", key, None
    if method == "GET":
        return ("get" if not set(query) - {"versionId", "partNumber"} else "other"), key, None
    if method in ("PUT", "POST"):
        return "put", key, None
    return "other", key, None


def _gs(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, str, str | None]:
    # JSON API: /storage/v1/b/<bucket>/o[/<name>], /download/storage/v1/..., /upload/storage/v1/b/<bucket>/o.
    if path.startswith("/upload/"):
        return ("put" if method in ("POST", "PUT") else "other"), _first(query, "name"), None
    download = path.startswith("/download/")
    rest = path.removeprefix("/download").removeprefix("/storage/v1/")
    parts = rest.split("/", 3)  # b, bucket, o, name
    if len(parts) < 3 or parts[0] != "b" or parts[2] != "o":
        return "other", "", None
    if len(parts) == 3 or not parts[3]:
        if method == "GET":
            return "list", "", _first(query, "prefix")
        return ("put" if method == "POST" else "other"), "", None
    name = parts[3]
    if method == "GET":
        return ("get" if download or _first(query, "alt") == "media" else "head"), name, None
    if method in ("POST", "PUT", "PATCH"):
        return "put", name, None
    return "other", name, None


def _az(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, str, str | None]:
    # Azurite's path style: /<account>/<container>[/<blob>].
    parts = path.lstrip("/").split("/", 2)
    comp = _first(query, "comp")
    if len(parts) < 3 or not parts[2]:
        if method == "GET" and comp == "list":
            return "list", "", _first(query, "prefix")
        return "other", "", None
    blob = parts[2]
    if method == "HEAD" or (method == "GET" and comp in ("metadata", "tags", "properties")):
        return "head", blob, None
    if method == "GET":
        return ("get" if not comp else "other"), blob, None
    if method == "PUT":
        return "put", blob, None
    return "other", blob, None


def count(scheme: str, requests: Iterable[tuple[str, str, int | str]]) -> dict[str, int]:
    """Requests by kind (every one of :data:`KINDS` and :data:`DETAILS`, zeros included), with ``total`` and
    ``throttled`` (answered 503: a store's SlowDown/ServerBusy, or the proxy's rate limit)."""
    counts: Counter[str] = Counter({k: 0 for k in (*KINDS, *DETAILS)})
    total = throttled = 0
    for method, path, status in requests:
        kind, detail = classify(scheme, method, path)
        counts[kind] += 1
        if detail is not None:
            counts[detail] += 1
        total += 1
        throttled += status == 503
    return {**counts, "total": total, "throttled": throttled}
