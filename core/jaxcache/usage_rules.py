"""The rules that make a key's figures from what processes did with it, each written once, over an :class:`Ops`.

The CLI's service-less prune applies them to parsed run records with :data:`PY`; the service builds its SQL from the
same functions with SQLAlchemy operations (``jaxcache.service.reports.usage.SQL``). NULL is ``None``, as in SQL:
comparisons with it are ``None`` and a ``case`` takes only a true condition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxcache.records import COMPILED, HIT, JOB, WRITE


@dataclass(frozen=True, slots=True)
class Ops:
    """The operations the rules are written in: SQL's, over values or over columns."""

    case: Callable[..., Any]  # case((condition, value), ..., else_=None)
    coalesce: Callable[..., Any]
    nullif: Callable[[Any, Any], Any]
    eq: Callable[[Any, Any], Any]
    gt: Callable[[Any, Any], Any]
    ge: Callable[[Any, Any], Any]
    and_: Callable[..., Any]
    or_: Callable[..., Any]
    sub: Callable[[Any, Any], Any]
    mul: Callable[[Any, Any], Any]
    nulls_last: Callable[[Any], Any]  # an ascending sort key with NULL after every value


def _strict(f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda a, b: None if a is None or b is None else f(a, b)


def _case(*whens: tuple[Any, Any], else_: Any = None) -> Any:
    return next((value for condition, value in whens if condition is True), else_)


def _and(*xs: Any) -> bool | None:
    return False if any(x is False for x in xs) else None if any(x is None for x in xs) else True


def _or(*xs: Any) -> bool | None:
    return True if any(x is True for x in xs) else None if any(x is None for x in xs) else False


#: The rules over plain Python values.
PY = Ops(
    case=_case, coalesce=lambda *xs: next((x for x in xs if x is not None), None),
    nullif=lambda a, b: None if a == b else a,
    eq=_strict(lambda a, b: a == b), gt=_strict(lambda a, b: a > b), ge=_strict(lambda a, b: a >= b),
    and_=_and, or_=_or,
    sub=_strict(lambda a, b: a - b), mul=_strict(lambda a, b: a * b),
    nulls_last=lambda x: (x is None, 0.0 if x is None else x),
)


def used_hits(op: Ops, kind: Any, hits: Any) -> Any:
    """The hits that count as use of a key: a job's. A warm-up's verify run hits every key the warm-up just wrote;
    counted, they would keep its entries from LRU prunes. Its writes still count (it is often a key's first
    writer)."""
    return op.case((op.eq(kind, JOB), hits), else_=0)


def credited_measure(op: Ops, platform_s: Any, writer_s: Any) -> Any:
    """The compile seconds a hit of a key is credited with: its platform's own (``platform_s``: what a job measured
    compiling it, on the device kind the key is for) where any job compiled it, else its first writer's (``writer_s``,
    measured on the writer's machine: a CPU warm-up's for a TPU job's key); NULL: neither is known (then
    :func:`saved` takes JAX's stored whole seconds, the writer's too)."""
    return op.coalesce(platform_s, writer_s)


def saved(op: Ops, kind: Any, hits: Any, retrieval_s: Any, jax_saved_s: Any, measure: Any) -> Any:
    """Seconds one process's hits of a key saved: the compile seconds it is credited with (``measure``, see
    :func:`credited_measure`), once per hit, less the seconds the hits spent loading; JAX's own figure (its stored whole
    seconds less loading, never below 0) where no measure is known, or where loading took longer."""
    used = used_hits(op, kind, hits)
    ours = op.sub(op.mul(used, measure), retrieval_s)
    return op.case((op.eq(used, 0), 0.0), (op.gt(ours, 0), ours), (op.gt(jax_saved_s, 0), jax_saved_s), else_=0.0)


def wrote(op: Ops, event: Any, writes: Any) -> Any:
    """Whether a process wrote the key."""
    return op.or_(op.gt(writes, 0), op.eq(event, WRITE))


def write_at(op: Ops, event: Any, writes: Any, first_at: Any, started_at: Any) -> Any:
    """When a process wrote the key: its first use of it, else its start; NULL: it did not write it."""
    return op.case((wrote(op, event, writes), op.coalesce(op.nullif(first_at, 0.0), started_at)))


def writer_order(op: Ops, at: Any, run_id: Any, process_index: Any) -> tuple[Any, ...]:
    """The sort key that makes the first of a key's writers its writer: the earliest :func:`write_at`, then run id
    and process index, so that every replica and the CLI pick the same one whatever order records arrive in."""
    return op.nulls_last(at), run_id, process_index


def hit_at(op: Ops, kind: Any, hits: Any, first_at: Any, last_at: Any) -> Any:
    """When a process last hit the key in a way that counts as use; NULL: it never did."""
    return op.case((op.gt(used_hits(op, kind, hits), 0),
                    op.nullif(op.coalesce(op.nullif(last_at, 0.0), first_at), 0.0)))


def is_miss(op: Ops, kind: Any, event: Any) -> Any:
    """A job's process compiled the key: the cache did not give it."""
    return op.and_(op.eq(kind, JOB), op.or_(op.eq(event, WRITE), op.eq(event, COMPILED)))


def is_recent(op: Ops, updated_at: Any, since: Any) -> Any:
    """Whether a process's record counts as recent use of its jaxlib (warm-ups' too: a warm-up for a new jaxlib runs
    before its jobs do, and what it wrote must not look stale to a prune meanwhile)."""
    return op.ge(updated_at, since)


def event_rank(op: Ops, event: Any) -> Any:
    """How informative a process's event is: write 2, compiled 1, hit 0. A key's row keeps its processes' greatest."""
    return op.case((op.eq(event, WRITE), 2), (op.eq(event, COMPILED), 1), else_=0)


def event_of(op: Ops, rank: Any) -> Any:
    """The event of a rank (:func:`event_rank`)."""
    return op.case((op.eq(rank, 2), WRITE), (op.eq(rank, 1), COMPILED), else_=HIT)
