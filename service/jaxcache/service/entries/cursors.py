"""The API's listing cursor, ``<sort value>~<key in base64url>`` (``fields.CURSOR``), translated to and from the
catalog's JSON cursor, which no OpenAPI pattern can describe."""

from __future__ import annotations

import base64
from decimal import Decimal

from fastapi import HTTPException

from jaxcache.service.entries.queries import decode_cursor, encode_cursor

MAX_LENGTH = 2048


def to_catalog(cursor: str, sort: str) -> str:
    """The catalog's cursor for an API cursor, or 404 when it continues a listing in another order."""
    value, _, key64 = cursor.partition("~")
    # Total: any base64url of valid length decodes, and bytes that are not UTF-8 still order as some text.
    raw = base64.urlsafe_b64decode(key64 + "=" * (-len(key64) % 4))
    key = raw.decode("utf-8", "replace").replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL
    if (sort == "name") != (value == ""):
        other = "by name" if value == "" else "by a number (size, compile, last_used, created or hits)"
        raise HTTPException(404, f"this cursor continues a listing sorted {other}, not by {sort}: start again "
                                 "without it")
    if sort == "name":
        return encode_cursor(key, key)
    return encode_cursor(float(value) if "." in value else int(value), key)


def from_catalog(cursor: str | None) -> str | None:
    """The API's spelling of the catalog's cursor of the next page."""
    if cursor is None:
        return None
    value, key = decode_cursor(cursor)
    key64 = base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")
    if isinstance(value, str):
        return f"~{key64}"
    if isinstance(value, float):
        value = format(Decimal(repr(value)), "f")  # positional, exactly the float: the pattern has no exponent
        value = value if "." in value else value + ".0"
    return f"{value}~{key64}"

