"""What the service's routes, pages and background loops share: one :class:`State` per app."""

from __future__ import annotations

import logging
from typing import Any

import anyio
from sqlalchemy import select

from jaxcache.errors import InvalidInputError, InvalidRootError, JaxcacheError, RootGoneError
from jaxcache.reach import deadline_s, reach
from jaxcache.service.auth import Authenticator
from jaxcache.service.background import Loops
from jaxcache.service.catalog.coordination import PruneLocks
from jaxcache.service.catalog.database import ENTRIES, USAGE, Catalog, Generations
from jaxcache.service.catalog.models import CacheRow
from jaxcache.service.metrics import Metrics
from jaxcache.service.reachability import Reachability
from jaxcache.service.settings import ServiceSettings, cpu_limit
from jaxcache.storage import Storage, is_object_store, normalise_root, open_storage

log = logging.getLogger("jaxcache.service")


def normal_dir(text: str) -> str | None:
    """A cache_dir or root URL as roots compare (storage.normalise_root, as the client and the CLI spell roots);
    None for a relative path (relative to a job's folder, which the service does not know) and what is no root."""
    try:
        return normalise_root(text, relative=False)
    except InvalidInputError:
        return None


class State:
    """Everything the routes share, built once per app."""

    def __init__(self, settings: ServiceSettings, *, prepared: bool = False) -> None:
        """``prepared``: the serving process already migrated the catalog and registered the caches' roots."""
        self.settings = settings
        self.auth = Authenticator(settings)
        self.catalog = Catalog(settings.catalog_url, migrate=not prepared, snapshot_dir=settings.snapshot_dir)
        self.generations = Generations(self.catalog)
        self.metrics = Metrics(list(settings.caches))
        self.loops = Loops(self.metrics, self.catalog, settings)
        # A root missing now (a volume not mounted yet) is a scan error to show, not a reason to serve no cache.
        self.storages: dict[str, Storage] = {name: open_storage(url, must_exist=False)
                                             for name, url in settings.caches.items()}
        #: How each root answered this process's last look (readiness, the caches' list, the dashboard, rescans).
        self.reach = Reachability(self.storages, deadline_s())
        self.prune_locks = PruneLocks(self.catalog.locks)
        self.report_limiter = anyio.CapacityLimiter(1)  # reports are parsed and stored one at a time
        # Listings read the catalog one per CPU this process may use: more threads only queue on the interpreter lock.
        self.read_limiter = anyio.CapacityLimiter(cpu_limit())
        #: ``{normalised root: [cache names]}`` (several names may share a root).
        self.roots: dict[str, list[str]] = {}
        for name, storage in self.storages.items():
            if (norm := normal_dir(storage.url)) is not None:
                self.roots.setdefault(norm, []).append(name)
        self.scanned: set[str] = set()
        self.prepared = prepared
        self.root_changes: list[Any] = []  # caches whose root changed since last served, set by app.create_app

    def open(self) -> None:
        """Start serving once the roots are registered; InvalidRootError for a missing root never scanned."""
        if not self.prepared:  # a client's tag from before (another catalog at this URL, a rebuilt one) is stale
            for name in self.settings.caches:
                self.generations.bump(name, ENTRIES, USAGE)
        self.follow()
        # A root scanned before and gone now (an unmounted volume) is served from its rows; a new one is a typo. A
        # store is looked at once the app serves (Reachability.look_all): one that does not answer must not hold the
        # listening socket back.
        for name, storage in self.storages.items():
            if name in self.scanned or is_object_store(storage.url):
                continue
            try:
                reach(storage, self.reach.deadline_s)
            except RootGoneError:
                raise InvalidRootError(f"cache {name!r}: {storage.url} does not exist or is not a directory: check"
                                       " the path, or run a JAX job with jax_compilation_cache_dir pointing there"
                                       " first") from None
            except JaxcacheError:
                pass  # unreachable now (a store, permissions): a scan error to show, not a reason not to start

    def follow(self) -> None:
        """Caches another process has scanned (or the catalog kept over a restart) count as scanned here."""
        with self.catalog.session() as s:
            self.scanned.update(s.scalars(select(CacheRow.name).where(CacheRow.name.in_(list(self.settings.caches)),
                                                                      CacheRow.last_scan_s.is_not(None))))

    def caches_at(self, cache_dir: str | None) -> list[str]:
        """The configured caches whose root is ``cache_dir`` (as a job spells it)."""
        norm = normal_dir(cache_dir) if cache_dir else None
        return self.roots.get(norm, []) if norm is not None else []

    def cache_for(self, cache_dir: str | None) -> str:
        """The configured cache whose root is ``cache_dir``; InvalidInputError (pass ``?cache=``) if none or several."""
        names = self.caches_at(cache_dir)
        if len(names) == 1:
            return names[0]
        if not names:
            said = f"cache_dir {cache_dir!r}" if cache_dir else "no cache_dir"
            raise InvalidInputError(f"the record has {said}, which is not the root of any configured cache: "
                                    "pass ?cache=NAME (GET /v1/caches lists them)")
        raise InvalidInputError(f"cache_dir {cache_dir!r} is the root of caches {', '.join(sorted(names))}: "
                                "pass ?cache=NAME")

    def filed_elsewhere(self, cache_dir: str | None, cache: str) -> list[str]:
        """The other caches whose root ``cache_dir`` is: a record filed under ``cache`` that belongs elsewhere."""
        names = self.caches_at(cache_dir)
        return [] if cache in names else sorted(names)

