"""The web dashboard at ``/``: server-rendered pages (Jinja2) over the API's own queries, assets shipped here."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from jaxcache.service.dashboard import pages, prune_page
from jaxcache.service.dashboard.site import STATIC, Dashboard
from jaxcache.service.prune.run import Handed
from jaxcache.service.state import State


def install(app: FastAPI, state: State, pruning: Handed) -> None:
    """Serve the dashboard at ``/`` and its assets at ``/static`` (all shipped in the package); the prune page runs
    what ``pruning`` holds, as the API's prunes do."""
    dash = Dashboard(state)
    app.include_router(pages.routes(dash))
    app.include_router(prune_page.routes(dash, pruning))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # Browsers ask for /favicon.ico on pages that name none (the API's /docs, a JSON answer); the pages name theirs.
    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(STATIC / "favicon.ico", media_type="image/x-icon",
                            headers={"Cache-Control": "public, max-age=86400"})

    app.state.dashboard = dash
