"""The catalog database's URL as a user writes it."""

from __future__ import annotations

import pytest

from jaxcache.errors import InvalidInputError
from jaxcache.service.catalog.database import Catalog


@pytest.mark.parametrize(("url", "said"), [
    ("postgres://jax:secret@db.example:5432/jax", "write postgresql+psycopg://jax:***@db.example:5432/jax"),
    ("postgres+psycopg2://jax:secret@db.example/jax", "write postgresql+psycopg://jax:***@db.example/jax"),
    ("postgresql+psycopg2://jax:secret@db.example/jax", "postgresql+psycopg://user:password@host/db"),
])
def test_a_postgresql_url_without_the_driver_here_names_the_one_to_write(url, said):
    """SQLAlchemy's own words were "Can't load plugin: sqlalchemy.dialects:postgres" (#73)."""
    with pytest.raises(InvalidInputError) as refused:
        Catalog(url, migrate=False)
    assert said in str(refused.value) and "secret" not in str(refused.value), refused.value
    assert "\n" not in str(refused.value)


def test_a_postgresql_url_without_a_driver_takes_psycopg():
    """SQLAlchemy's default driver is psycopg2 before 2.1, which jaxcache-service does not install."""
    catalog = Catalog("postgresql://jax:secret@127.0.0.1:9/jax", migrate=False)
    try:
        assert catalog.engine.url.drivername == "postgresql+psycopg"
    finally:
        catalog.dispose()
