"""What catalog tables are built from: the declarative base, code-point-ordered strings, nullable JSON."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import JSON, ColumnElement, String, Table
from sqlalchemy.orm import DeclarativeBase

#: Python None as SQL NULL, not JSON ``null``, so "no parts recorded" is visible to ``IS NULL`` and indexes.
NullableJSON = JSON(none_as_null=True)


def Str(length: int) -> String:
    """A string column ordered by code point on every backend (PostgreSQL: collation "C"), as keyset cursors need."""
    return String(length).with_variant(String(length, collation="C"), "postgresql")


class Base(DeclarativeBase):
    pass


def table_of(model: type[Base]) -> Table:
    """A model's ``__table__`` typed as the Table it is here, for Core statements such as ``update()``."""
    return cast(Table, model.__table__)


def max_length(column: ColumnElement[Any]) -> int:
    """The length of a ``Str`` column: longer values would not fit."""
    kind = column.type
    if not isinstance(kind, String) or kind.length is None:
        raise TypeError(f"{column} is not a string column of bounded length")
    return kind.length
