"""Decoded JSON (dicts, lists, scalars) walked with a loop, not recursion: a body nested as deep as a decoder
allows must not exhaust the interpreter's stack in whatever reads it next."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Path = tuple[str | int, ...]


def leaves(data: Any, at: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every value of ``data`` that is not a dict or a list (tuples count as lists), with where it is."""
    todo: list[tuple[Path, Any]] = [(at, data)]
    while todo:
        path, node = todo.pop()
        if isinstance(node, dict):
            todo.extend(((*path, k), v) for k, v in reversed(node.items()))
        elif isinstance(node, list | tuple):
            todo.extend(((*path, i), v) for i, v in reversed(list(enumerate(node))))
        else:
            yield path, node


def map_leaves(data: Any, fn: Callable[[Any], Any]) -> Any:
    """A copy of ``data`` with ``fn`` applied to every value that is not a dict or a list (tuples become lists)."""
    def copy(node: Any) -> Any:
        if isinstance(node, dict):
            out: dict[Any, Any] = dict(node)
            todo.append(out)
            return out
        if isinstance(node, list | tuple):
            items = list(node)
            todo.append(items)
            return items
        return fn(node)

    todo: list[Any] = []
    top = copy(data)
    while todo:
        node = todo.pop()
        for k in node.keys() if isinstance(node, dict) else range(len(node)):
            node[k] = copy(node[k])
    return top
