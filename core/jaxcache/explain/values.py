"""The readable value behind a key part, where records carry one, and what changed between two of them."""

from __future__ import annotations

from typing import Any

from jaxcache import keyparts as kp
from jaxcache.explain.model import Known, PartDiff


def readable(part: str, known: Known) -> str | None:
    """The value a record shows for ``part`` (None where JAX hashes something no record shows)."""
    fp = known.fingerprint
    if fp is None:
        return None
    if part == kp.JAXLIB:
        return fp.jaxlib
    if part == kp.BACKEND:
        return " ".join(p for p in (fp.backend, fp.platform_version) if p) or None
    if part == kp.XLA_FLAGS:
        return None if fp.xla_flags is None else " ".join(fp.xla_flags) or "(none)"
    if part == kp.DEVICES:
        if fp.device_count is None:
            return None
        processes = fp.process_count or 1
        text = f"{fp.device_count} × {fp.device_kind or 'device'} in {processes} process{'es' if processes > 1 else ''}"
        return f"{text} ({known.topology})" if known.topology else text
    if part == kp.COMPRESSION:
        return fp.compression
    return None


def flag_changes(mine: tuple[str, ...], theirs: tuple[str, ...]) -> list[str]:
    """Flags added, removed or changed going from ``theirs`` (the entry's writer) to ``mine`` (the job)."""
    def by_name(flags: tuple[str, ...]) -> dict[str, str | None]:
        return {f.split("=", 1)[0]: (f.split("=", 1)[1] if "=" in f else None) for f in flags}

    a, b = by_name(theirs), by_name(mine)
    out = [f"added {n}" + (f"={b[n]}" if b[n] is not None else "") for n in sorted(b.keys() - a.keys())]
    out += [f"removed {n}" + (f"={a[n]}" if a[n] is not None else "") for n in sorted(a.keys() - b.keys())]
    out += [f"{n}: {a[n]} → {b[n]}" for n in sorted(a.keys() & b.keys()) if a[n] != b[n]]
    return out


def diff(part: str, miss: Known, nearest: Known) -> PartDiff:
    """``part`` as the miss and the nearest key show it."""
    if part == kp.COMPUTATION:
        changes: list[str] = []
        if miss.program is not None and nearest.program is not None:
            changes = miss.program.changes(nearest.program) or ["the signature is equal: the program body changed"]
        return PartDiff(part, _signature(miss), _signature(nearest), tuple(changes))
    mine, theirs = readable(part, miss), readable(part, nearest)
    if part == kp.XLA_FLAGS and miss.fingerprint and nearest.fingerprint:
        flags = flag_changes(miss.fingerprint.xla_flags or (), nearest.fingerprint.xla_flags or ())
        return PartDiff(part, mine, theirs, tuple(flags))
    if part == kp.COMPILE_OPTIONS and miss.parts and nearest.parts:
        changes = miss.parts.option_changes(nearest.parts)
        mine, theirs = (miss.parts.compile_options or "")[:12], (nearest.parts.compile_options or "")[:12]
        return PartDiff(part, mine, theirs, tuple(changes))
    if mine is None and theirs is None and miss.parts and nearest.parts:
        mine, theirs = (getattr(miss.parts, part) or "")[:12], (getattr(nearest.parts, part) or "")[:12]
    return PartDiff(part, mine, theirs)


def _signature(known: Known) -> str | None:
    if known.program is None:
        return None
    return f"({', '.join(known.program.args)}) -> ({', '.join(known.program.results)})"


def differs_text(diffs: list[dict[str, Any]]) -> str:
    """What differs (``Explanation.as_dict()["differs"]``), in a few words for a table cell."""
    parts = []
    for d in diffs[:3]:
        said = "; ".join(d["changes"][:2]) if d["changes"] else (
            f"{d['theirs']} → {d['mine']}" if d["mine"] or d["theirs"] else "")
        parts.append(f"{d['part']}: {said}" if said else d["part"])
    return ", ".join(parts)
