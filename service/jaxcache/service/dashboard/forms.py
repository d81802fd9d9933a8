"""The prune form: its fields as the page shows them, and as the API's own request model."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException, Request
from pydantic import ValidationError

from jaxcache.errors import InvalidInputError
from jaxcache.service.prune.schemas import PruneRequest

POLICY_TEXT = ("max_total_bytes", "unused_for", "older_than", "min_age", "stale_jaxlib_window")
POLICY_LISTS = ("functions", "keep", "integrity")
POLICY_FLAGS = ("corrupt", "orphans", "stale_jaxlib")
POLICY_FIELDS = POLICY_TEXT + POLICY_LISTS + POLICY_FLAGS
_SPLIT = re.compile(r"[\s,]+")


def _split(text: str) -> list[str]:
    return [p for p in _SPLIT.split(text) if p]


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (what HTML forms post), last value of each field."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        raise HTTPException(415, "post this form from the page (application/x-www-form-urlencoded)")
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in urllib.parse.parse_qs(body, keep_blank_values=True).items()}


def policy_form(values: Mapping[str, str]) -> dict[str, str]:
    """The prune form's fields as strings, for re-rendering and for hidden fields."""
    out = {f: values.get(f, "").strip() for f in POLICY_TEXT + POLICY_LISTS}
    out.update({f: "on" if values.get(f, "").strip() else "" for f in POLICY_FLAGS})
    return out


def policy_request(form: Mapping[str, str], *, dry_run: bool) -> PruneRequest:
    """The API's request model from the form: the same validation, the same policy."""
    data: dict[str, Any] = {f: form[f] for f in POLICY_TEXT if form[f]}
    data.update({f: _split(form[f]) for f in POLICY_LISTS if form[f]})
    data.update({f: True for f in POLICY_FLAGS if form[f]})
    try:
        return PruneRequest(**data, dry_run=dry_run)
    except ValidationError as exc:
        problems = (f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidInputError("; ".join(problems)) from None
