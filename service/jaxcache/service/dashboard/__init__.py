"""The web dashboard at ``/``: server-rendered pages (Jinja2) over the API's own queries, assets shipped here."""

from jaxcache.service.dashboard.routes import install

__all__ = ["install"]
