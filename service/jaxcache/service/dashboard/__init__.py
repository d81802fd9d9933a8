"""The web dashboard at ``/``: server-rendered pages (Jinja2) over the API's own queries, assets shipped here."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from jaxcache.service.dashboard import pages, prune_page
from jaxcache.service.dashboard.site import STATIC, Dashboard
from jaxcache.service.state import State


def install(app: FastAPI, state: State) -> None:
    """Serve the dashboard at ``/`` and its assets at ``/static`` (all shipped in the package)."""
    dash = Dashboard(state)
    app.include_router(pages.routes(dash))
    app.include_router(prune_page.routes(dash))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.state.dashboard = dash
