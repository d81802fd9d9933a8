"""The usage rules (:mod:`jaxcache.usage_rules`, which the CLI's prune applies in Python) as SQL over the rows they
apply to. :mod:`.aggregates` builds its statements from these.
"""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, or_
from sqlalchemy.sql.elements import KeyedColumnElement

from jaxcache import usage_rules
from jaxcache.usage_rules import Ops

Col = ColumnElement[Any]

#: The rules' operations as SQLAlchemy expressions.
SQL = Ops(
    case=lambda *whens, else_=None: case(*whens, else_=else_), coalesce=func.coalesce, nullif=func.nullif,
    eq=operator.eq, gt=operator.gt, ge=operator.ge, and_=and_, or_=or_,
    sub=operator.sub, mul=operator.mul, nulls_last=lambda x: x.asc().nulls_last(),
)

used_hits = partial(usage_rules.used_hits, SQL)
saved = partial(usage_rules.saved, SQL)
wrote = partial(usage_rules.wrote, SQL)
write_at = partial(usage_rules.write_at, SQL)
hit_at = partial(usage_rules.hit_at, SQL)
is_miss = partial(usage_rules.is_miss, SQL)
is_recent = partial(usage_rules.is_recent, SQL)
event_rank = partial(usage_rules.event_rank, SQL)
event_of = partial(usage_rules.event_of, SQL)


def most_informative(event: Col) -> Col:
    """The aggregate of processes' events a row keeps: write, else compiled, else hit."""
    return event_of(func.max(event_rank(event)))


def first_writer(partition: list[KeyedColumnElement[Any]], at: Col, run_id: Col, process_index: Col) -> Col:
    """1 on the row of each ``partition`` that wrote the key first (:func:`jaxcache.usage_rules.writer_order`);
    rows that did not write (``at`` NULL) come last."""
    order = usage_rules.writer_order(SQL, at, run_id, process_index)
    return func.row_number().over(partition_by=partition, order_by=list(order))
