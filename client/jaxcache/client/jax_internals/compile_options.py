"""The JAX wall, compile options side: the options JAX hashes into a key's ``compile_options`` part, as named fields
(docs/jax-internals.md, "Key parts"), so that a miss can say which option differed rather than two hashes.

JAX hashes a copy of the options with the dump and path fields blanked (``cache_key._hash_serialized_compile_options``):
the fields here are read from exactly those bytes. Only fields that differ from XLA's defaults, or that a flag
names, are kept: an option a record does not list has its default, and a record stays small.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from jaxcache.keyparts import MAX_OPTION_TEXT, MAX_OPTIONS, MORE, OptionFields

#: The private function whose bytes JAX hashes (it hands them to ``hash_obj.update``).
HASHED = ("jax._src.cache_key", "_hash_serialized_compile_options")
# Fields that hold the others, or that name no option; ``env_option_overrides`` is listed as jax.jit's
# compiler_options, one field each.
_CONTAINERS = {"executable_build_options", "debug_options", "env_option_overrides"}
_TEXT_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*)$")


class _Bytes:
    """Stands in for the hash object: keeps the bytes JAX would hash."""

    data = b""

    def update(self, data: bytes) -> None:
        self.data = bytes(data)


def hashed_fields(options: Any, platform: str, flags: Iterable[str] = ()) -> OptionFields | None:
    """The fields of ``options`` as JAX hashes them for ``platform`` that differ from XLA's defaults, or that one of
    ``flags`` (the XLA flags JAX hashed, ``--name=value``) names; None where this JAX does not let them be read."""
    try:
        mine = _fields(_as_hashed(options, platform))
        base = _defaults(platform) or {}
    except Exception:  # noqa: BLE001 - bindings that moved: the options go unnamed, the compile goes on
        return None
    if mine is None:
        return None
    named = {f.lstrip("-").split("=", 1)[0] for f in flags}
    kept = sorted((n, v) for n, v in mine.items() if base.get(n) != v or n in named)
    kept = sorted(kept + [(n, "(unset)") for n in base.keys() - mine.keys()])
    if len(kept) > MAX_OPTIONS:  # say so: an option left out must not read as its default
        kept = [*kept[: MAX_OPTIONS - 1], (MORE, f"{len(kept) - MAX_OPTIONS + 1} more not recorded")]
    return tuple((_bounded(n), _bounded(v)) for n, v in kept)


def problems() -> list[str]:
    """What :func:`hashed_fields` needs and this JAX lacks (for :func:`jaxcache.client.jax_internals.probe`)."""
    import importlib

    from jaxlib import xla_client

    module, name = HASHED
    out = []
    if not hasattr(importlib.import_module(module), name):
        out.append(f"{module} has no {name} (run records cannot name the compile options that differ)")
    if not hasattr(xla_client.CompileOptions, "ParseFromString"):
        out.append("jaxlib.xla_client.CompileOptions has no ParseFromString (the compile options go unnamed)")
    return out


@functools.cache
def _defaults(platform: str) -> dict[str, str] | None:
    from jaxlib import xla_client

    return _fields(_as_hashed(xla_client.CompileOptions(), platform))


def _as_hashed(options: Any, platform: str) -> Any:
    """A copy of ``options`` parsed back from the bytes JAX hashes; None where that cannot be done here."""
    from jax._src import cache_key
    from jaxlib import xla_client

    blank = getattr(cache_key, HASHED[1], None)
    if blank is None:
        return None
    sink = _Bytes()
    try:
        blank(sink, options, strip_device_assignment=platform == "gpu")
        return xla_client.CompileOptions.ParseFromString(sink.data)
    except Exception:  # noqa: BLE001 - a JAX that moved: the options go unnamed, the compile goes on
        return None


def _fields(options: Any) -> dict[str, str] | None:
    if options is None:
        return None
    # Hold each level: a nested object of the bindings does not keep its parent alive.
    build = options.executable_build_options
    debug = build.debug_options
    out: dict[str, str] = {}
    for prefix, level in (("", options), ("executable_build_options.", build)):
        for name in dir(level):
            if name.startswith("_") or name in _CONTAINERS:
                continue
            try:
                value = getattr(level, name)
            except Exception:  # noqa: BLE001, S112 - a field the bindings cannot show is left out
                continue
            if callable(value):
                continue
            text = _text(value)
            if out.setdefault(name, text) != text:
                out[prefix + name] = text
    for name, value in getattr(options, "env_option_overrides", None) or ():
        out[f"compiler_options.{name}"] = _text(value)
    # The debug options (XLA's hundreds of xla_* fields) show all only in their text form, one field a line.
    depth = 0
    for line in str(debug).splitlines():
        line = line.strip()
        if line.endswith("{"):
            depth += 1
        elif line == "}":
            depth = max(depth - 1, 0)
        elif depth == 0 and (m := _TEXT_FIELD.match(line)):
            name, value = m.group(1), m.group(2).strip()
            out[name] = f"{out[name]}, {value}" if name in out else value
    return out


def _text(value: Any) -> str:
    """A field's value, short: runs of equal items in a list counted ("[True ×3, False]"), bytes by size."""
    if isinstance(value, bytes):
        return f"{len(value)} bytes" + (f" #{hashlib.sha256(value).hexdigest()[:8]}" if value else "")
    if isinstance(value, (list, tuple)):
        runs: list[list[Any]] = []
        for item in value:
            text = _text(item)
            if runs and runs[-1][0] == text:
                runs[-1][1] += 1
            else:
                runs.append([text, 1])
        return "[" + ", ".join(t if n == 1 else f"{t} ×{n}" for t, n in runs) + "]"
    return str(value)


def _bounded(text: str) -> str:
    text = text.replace("\x00", "\\0")
    if len(text) <= MAX_OPTION_TEXT:
        return text
    return text[: MAX_OPTION_TEXT - 11] + "… #" + hashlib.sha256(text.encode()).hexdigest()[:8]
