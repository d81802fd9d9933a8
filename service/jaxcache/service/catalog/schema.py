"""What every catalog table is built from: the declarative base, code-point-ordered strings, nullable JSON, and
helpers that read a table's shape."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import JSON, ColumnElement, String, Table
from sqlalchemy.orm import DeclarativeBase

#: A nullable JSON column whose Python None is SQL NULL (not the JSON text ``null``): "no parts recorded" must be
#: a condition an index and ``IS NULL`` can see.
NullableJSON = JSON(none_as_null=True)


def Str(length: int) -> String:
    """A string column that compares and sorts by code point on every backend: SQLite's default (BINARY), and
    collation "C" on PostgreSQL, whose default collation follows the server's locale (``jit_b`` before ``JIT_A``
    there, ``_`` ignored). Listings sort by key and the keyset cursor compares keys, so every replica and the API's
    documented order must agree, and a range over a function-name prefix must select exactly that prefix."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class Base(DeclarativeBase):
    pass


def table_of(model: type[Base]) -> Table:
    """The table a model is mapped to, for Core statements: SQLAlchemy types ``__table__`` as any FromClause (a
    model may map a join or a subquery), which ``update()`` does not take; every model here maps a Table."""
    return cast(Table, model.__table__)


def max_length(column: ColumnElement[Any]) -> int:
    """The length of a ``Str`` column: longer values would not fit."""
    kind = column.type
    if not isinstance(kind, String) or kind.length is None:
        raise TypeError(f"{column} is not a string column of bounded length")
    return kind.length
