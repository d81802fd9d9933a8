"""How pages show the API's numbers, times and names, and the growth chart's SVG geometry. Pages also carry the
exact value in ``data-value`` (sizes in ``title``), so readers and tests see the API's figure."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from markupsafe import Markup

from jaxcache.display import shown
from jaxcache.explain.values import differs_text
from jaxcache.service.dashboard import names
from jaxcache.units import format_bytes, plural

DASH = "–"


def size(n: int | float | None) -> str:
    """``1536`` → ``1.5 KiB`` (IEC units, as the CLI prints them)."""
    return DASH if n is None else format_bytes(n)


def seconds(s: float | None) -> str:
    """Compile seconds: ``0 s``, ``4.2 s``, ``3.5 min``, ``2.1 h``, ``3.0 d``."""
    if s is None:
        return DASH
    if abs(s) < 60:
        return f"{s:.0f} s" if float(s).is_integer() else f"{s:.1f} s"
    unit, size_ = ("min", 60) if abs(s) < 3600 else ("h", 3600) if abs(s) < 86400 else ("d", 86400)
    return f"{s / size_:.1f} {unit}"


def rate(r: float | None) -> str:
    """A hit rate: ``97.3 %``, or a dash when nothing was looked up."""
    return DASH if r is None else f"{r * 100:.1f} %"


def count(n: int | None) -> str:
    """``12345`` → ``12,345``."""
    return DASH if n is None else f"{n:,}"


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``12345, "entry"`` → ``12,345 entries``; ``1, "entry"`` → ``1 entry``."""
    return f"{n:,}" + plural(n, noun, nouns)[len(str(n)):]


def utc(ts: float | None) -> str:
    """``2026-11-30 08:15 UTC``."""
    if ts is None:
        return DASH
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def age(seconds_: float) -> str:
    """``90061`` → ``1d 1h``; ``864018`` → ``10d``: the largest unit and, when not zero, the next one."""
    s = int(max(seconds_, 0))
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    i = next(i for i, (unit, size_) in enumerate(units) if s >= size_ or unit == "s")
    (unit, size_), (nxt, nsize) = units[i], units[min(i + 1, 3)]
    rest = (s % size_) // nsize if i < 3 else 0
    return f"{s // size_}{unit}" + (f" {rest}{nxt}" if rest else "")


def ago(ts: float | None, now: float | None = None) -> Markup:
    """A ``<time>`` element reading ``3d 4h ago``, with the exact UTC time as its datetime and title."""
    if ts is None:
        return Markup(DASH)
    now = time.time() if now is None else now
    delta = now - ts
    text = "just now" if abs(delta) < 1 else (f"{age(delta)} ago" if delta > 0 else f"in {age(-delta)}")
    iso = datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, utc(ts), text)


def by_cause(missed: list[dict]) -> list[dict]:
    """A job's misses (``job_misses``: by key and cause) grouped by cause (unexplained ones as None), most compile
    time lost first: the misses and seconds of each, counted as ``jaxcache explain`` counts them."""
    groups: dict[str | None, list[dict]] = {}
    for m in missed:
        groups.setdefault(m["cause"], []).append({**m, "differs_text": differs_text(m["differs"])})
    out = [{"cause": cause or "unexplained", "misses": sum(m["misses"] for m in ms),
            "compile_s": sum(m["compile_s"] for m in ms), "fix": ms[0]["fix"], "missed": ms}
           for cause, ms in groups.items()]
    return sorted(out, key=lambda g: (-g["compile_s"], g["cause"]))


def top_causes(by_cause: dict, limit: int = 10) -> list[dict]:
    """The week's causes (stats' ``misses_by_cause``), most compile time lost first, with the day's count beside."""
    day = {c["cause"]: c["misses"] for c in by_cause["last_24h"]["causes"]}
    return [{**c, "misses_24h": day.get(c["cause"], 0)} for c in by_cause["last_7d"]["causes"][:limit]]


#: The core's escaping, as the CLI shows names; templates use :func:`names.visible`, its HTML-safe form.
visible = shown


def short_key(key: str) -> Markup:
    """``jit_f-74b295da…`` : the function and the start of the hash, for tables (shown :func:`names.visible`)."""
    head, _, digest = key.rpartition("-")
    return names.visible(f"{head}-{digest[:8]}…" if head and len(digest) == 64 else key)


@dataclass(frozen=True, slots=True)
class Bar:
    day: str
    x: float
    y: float
    width: float
    height: float
    entries: int
    size_bytes: int
    total_bytes: int  # held at the end of the day by the entries present now


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: list[Bar]
    line: str  # polyline points: bytes held by today's entries at the end of each day, level across the day
    y_max_bytes: int
    top: float
    bottom: float
    left: float
    right: float
    start: str  # the x axis's two ends: the first day's date and the last's, or one day's start and end times
    end: str
    span: str  # the days shown, in words for the chart's title


def growth_label(first_created_s: float | None, now: float | None = None) -> str:
    """What the growth figure is a mean of: ``7 d``, or the days a younger cache has existed (``2.5 d``)."""
    age_days = 0.0 if first_created_s is None else ((time.time() if now is None else now) - first_created_s) / 86400
    return "7 d" if age_days >= 7 else f"{age_days:.1f} d"


def growth_chart(growth: list[dict], total_bytes: int, *, today: date | None = None, days: int = 30,
                 first_day: date | None = None, width: int = 720, height: int = 220) -> Chart:
    """Bars of bytes written per day (last ``days`` days, not before ``first_day``) and a line of what today's
    entries held at each day's end: a lower bound, since pruned entries are gone from the catalog."""
    today = today or datetime.now(UTC).date()
    if first_day is not None:
        days = max(1, min(days, (today - first_day).days + 1))
    by_day = {g["day"]: g for g in growth}
    series = [(today - timedelta(days=days - 1 - i)).isoformat() for i in range(days)]
    added = [int(by_day.get(d, {}).get("size_bytes", 0)) for d in series]
    entries = [int(by_day.get(d, {}).get("entries", 0)) for d in series]
    totals = [total_bytes - sum(added[i + 1:]) for i in range(days)]  # held at the end of each day
    left, right, top, bottom = 56.0, width - 8.0, 12.0, height - 28.0
    y_max = max([*totals, *added, 1])
    step = (right - left) / days

    def y(v: int) -> float:
        return bottom - (bottom - top) * v / y_max

    bar_width = min(max(step - 2, 1), 48)  # a young cache's few days stay bars, not slabs
    bars = [
        Bar(day=d, x=round(left + i * step + (step - bar_width) / 2, 2), y=round(y(a), 2), width=round(bar_width, 2),
            height=round(bottom - y(a), 2), entries=n, size_bytes=a, total_bytes=t)
        for i, (d, a, n, t) in enumerate(zip(series, added, entries, totals, strict=True))
    ]
    # A step across each day's whole slot, not a point at its middle: a cache one day old (the demo's) has one day,
    # and a line through one point draws nothing.
    line = " ".join(f"{round(left + (i + edge) * step, 2)},{round(y(t), 2)}" for i, t in enumerate(totals)
                    for edge in (0, 1))
    # A chart of one day spans it from midnight to midnight (UTC): its ends are those times, not its date twice.
    start, end, span = ((series[0], series[-1], f"{series[0]} to {series[-1]}") if days > 1 else
                        (f"{series[0]} 00:00", "24:00 UTC", f"on {series[0]} (UTC)"))
    return Chart(width=width, height=height, bars=bars, line=line, y_max_bytes=y_max, top=top, bottom=bottom,
                 left=left, right=right, start=start, end=end, span=span)
