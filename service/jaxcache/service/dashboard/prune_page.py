"""The prune page: the API's policy fields, a dry-run preview, and apply (admin, typed cache name, form token)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRouter
from pydantic import ValidationError

from jaxcache.errors import InvalidInputError
from jaxcache.service.dashboard.site import MAX_SHOWN, Dashboard, ToLogin, Viewer, html_route, read_form
from jaxcache.service.prune import audit as prune_audit
from jaxcache.service.prune import run as pruning
from jaxcache.service.prune.run import Handed, PruneInProgressError
from jaxcache.service.prune.schemas import PruneRequest, policy_of, response_of

POLICY_TEXT = ("max_total_bytes", "unused_for", "older_than", "min_age", "stale_jaxlib_window")
POLICY_LISTS = ("functions", "keep", "integrity")
POLICY_FLAGS = ("corrupt", "orphans", "stale_jaxlib")


def policy_form(values: Mapping[str, str]) -> dict[str, str]:
    """The prune form's fields as strings, for re-rendering and for hidden fields."""
    out = {f: values.get(f, "").strip() for f in POLICY_TEXT + POLICY_LISTS}
    out.update({f: "on" if values.get(f, "").strip() else "" for f in POLICY_FLAGS})
    return out


#: The form's label of each policy field: what its errors name (the API's names mean nothing on the page).
LABELS = {"max_total_bytes": "Max total size", "unused_for": "Unused for", "older_than": "Older than",
          "functions": "Functions", "corrupt": "Corrupt entries", "orphans": "Orphaned -atime files",
          "stale_jaxlib": "Stale jaxlib", "stale_jaxlib_window": "Stale jaxlib window",
          "integrity": "Integrity classes", "keep": "Keep", "min_age": "Minimum age"}
_FIELD_NAMES = re.compile(r"\b(" + "|".join(sorted(LABELS, key=len, reverse=True)) + r")\b")


def worded(message: str) -> str:
    """A policy error as the page says it: each API field name as the form's label ("Max total size")."""
    return _FIELD_NAMES.sub(lambda m: f"“{LABELS[m.group(1)]}”", message)


def _problem(error: Any) -> str:
    """One validation error as the entries filter says it: the field's label, then the validator's own words
    ("'lots' is not a size: ..."), not pydantic's ("Value error, ...")."""
    field = str(error["loc"][0]) if error["loc"] else ""
    said = str(error["ctx"]["error"]) if error["type"] == "value_error" and "error" in error.get("ctx", {}) else (
        error["msg"])
    if said.startswith("Input should") and isinstance(error.get("input"), str):
        said = repr(error["input"]) + said.removeprefix("Input")
    return f"{LABELS.get(field, field)}: {said}"


def policy_request(form: Mapping[str, str], *, dry_run: bool) -> PruneRequest:
    """The API's request model from the form: the same validation, the same policy."""
    data: dict[str, Any] = {f: form[f] for f in POLICY_TEXT if form[f]}
    data.update({f: [p for p in re.split(r"[\s,]+", form[f]) if p] for f in POLICY_LISTS if form[f]})
    data.update({f: True for f in POLICY_FLAGS if form[f]})
    try:
        return PruneRequest(**data, dry_run=dry_run)
    except ValidationError as exc:
        raise InvalidInputError("; ".join(dict.fromkeys(_problem(e) for e in exc.errors()))) from None


def routes(dash: Dashboard, handed: Handed) -> APIRouter:
    state = dash.state
    router = APIRouter(route_class=html_route(dash), include_in_schema=False)

    def prune_page(request: Request, viewer: Viewer, cache: str, form: dict[str, str], *, status: int = 200,
                   preview: Any = None, error: str | None = None, applied_id: int | None = None) -> Response:
        with state.catalog.reader() as conn:
            audit = prune_audit.prunes(conn, cache, limit=50)
            applied = [] if applied_id is None else prune_audit.prunes(conn, cache, limit=1, audit_id=applied_id)
        return dash.render(request, "prune.html", status=status, viewer=viewer, cache=cache, section="prune",
                           form=form, labels=LABELS, preview=preview, error=error,
                           applied=applied[0] if applied else None, audit=audit,
                           csrf=dash.csrf(viewer, f"prune:{cache}"))

    # Each route checks the token on the event loop, then does its catalog work and rendering in one thread hop.
    @router.get("/caches/{cache}/prune")
    async def prune_form(request: Request, cache: str) -> Response:
        viewer = dash.viewer(request, cache=cache)
        return await run_in_threadpool(preview, request, viewer, cache)

    def preview(request: Request, viewer: Viewer, cache: str) -> Response:
        q = request.query_params
        form = policy_form(q)
        planned = error = None
        status = 200
        if q.get("preview"):
            try:
                policy, policy_json = policy_of(policy_request(form, dry_run=True))
                outcome = pruning.prune(state, cache, policy, handed=handed, policy_json=policy_json, dry_run=True,
                                        who=viewer.who)
                planned = response_of(outcome, dry_run=True, limit=MAX_SHOWN)
            except InvalidInputError as exc:
                error, status = worded(str(exc)), 400
        applied_id = int(q["applied"]) if q.get("applied", "").isdigit() else None
        return prune_page(request, viewer, cache, form, status=status, preview=planned, error=error,
                          applied_id=applied_id)

    @router.post("/caches/{cache}/prune")
    async def prune_apply(request: Request, cache: str) -> Response:
        dash.cache_or_404(cache)
        form_values = await read_form(request)
        try:
            viewer = dash.viewer(request, "admin")
        except HTTPException as exc:
            try:
                reader = dash.viewer(request)
            except (HTTPException, ToLogin):
                raise exc from None
            message = (f"Applying a prune needs an admin token; you are signed in with "
                       f"{'a ' + reader.scope + ' token' if reader.scope else 'anonymous read access'}. "
                       "Nothing was deleted.")
            return await run_in_threadpool(prune_page, request, reader, cache, policy_form(form_values),
                                           status=exc.status_code, error=message)
        dash.check_form(request, viewer, form_values, f"prune:{cache}")
        return await run_in_threadpool(apply, request, viewer, cache, form_values)

    def apply(request: Request, viewer: Viewer, cache: str, form_values: dict[str, str]) -> Response:
        form = policy_form(form_values)
        if form_values.get("confirm", "").strip() != cache:
            return prune_page(request, viewer, cache, form, status=400, error=f"To apply, type the cache name "
                              f"({cache}) in the confirmation box. Nothing was deleted.")
        try:
            policy, policy_json = policy_of(policy_request(form, dry_run=False))
            outcome = pruning.prune(state, cache, policy, handed=handed, policy_json=policy_json, dry_run=False,
                                    who=viewer.who)
        except InvalidInputError as exc:
            return prune_page(request, viewer, cache, form, status=400,
                              error=f"{worded(str(exc))}. Nothing was deleted.")
        except PruneInProgressError:
            return prune_page(request, viewer, cache, form, status=409,
                              error=f"A prune of {cache} is already running; try again when it ends.")
        base = request.scope.get("root_path", "").rstrip("/")
        query = urllib.parse.urlencode({"applied": outcome.audit_id})
        return RedirectResponse(f"{base}/caches/{urllib.parse.quote(cache, safe='')}/prune?{query}", 303)

    return router
