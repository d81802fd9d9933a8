"""The ``ls`` table, split into what the listing fixes and what the clock moves.

Names, hashes, sizes, compile seconds, compression and status stay the same while the root lists the same; the two
ages (AGE, LAST USED) change with the time of asking. So the fixed cells are kept padded, with each entry's creation
and last-use times, and a repeated ``ls`` of an unchanged root prints them with ages worked out now instead of
folding and formatting every entry from the index again. Laid out exactly as :func:`jaxcache.table.render` lays out
the same cells.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from jaxcache.display import shown
from jaxcache.scan import Entry
from jaxcache.units import format_bytes, format_duration, plural

#: STORED COMPILE: the whole seconds JAX stored in the entry (the glossary's "stored compile s", user guide).
HEADERS = ("FUNCTION", "HASH", "SIZE", "STORED COMPILE", "AGE", "LAST USED", "COMPRESSION", "STATUS")
_RIGHT = frozenset({2, 3, 4, 5})
_AGE, _USED = 4, 5  # the columns the clock moves; the cells before and after them are fixed
_GAP = "  "
#: What LAST USED reads, under every table with rows: the service's last use (reported hits) may be newer.
USED_NOTE = ("LAST USED: from JAX's -atime files, written only while JAX's LRU is on (jax_compilation_cache_max_size;"
             " '-': none); hits that jobs report (run records, the service's pages) may be newer")


class LsTable(msgspec.Struct, array_like=True, gc=False):
    """One ``ls`` table without its ages: the fixed cells before and after them, padded, per row and for the
    header; each row's creation and last-use time (None: no ``-atime`` file, shown as "-"); the lines after it."""

    head_before: str
    head_after: str
    before: list[str]
    after: list[str]
    created_s: list[float]
    used_s: list[float | None]
    footer: str

    def render(self, now: float) -> bytes:
        """The table with ages as of ``now``, and its footer: what ``ls`` prints."""
        age_head, ages = _column(HEADERS[_AGE], now, self.created_s)
        used_head, used = _column(HEADERS[_USED], now, self.used_s)
        lines = [self.head_before + age_head + used_head + self.head_after]
        lines += [b + a + u + c for b, a, u, c in zip(self.before, ages, used, self.after, strict=True)]
        lines.append(self.footer)
        return "\n".join(lines).encode() + b"\n"

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


_DECODER = msgspec.msgpack.Decoder(LsTable)


def decode(data: bytes) -> LsTable | None:
    """A kept table, or None where ``data`` is not one (an older layout: answered afresh)."""
    try:
        return _DECODER.decode(data)
    except msgspec.DecodeError:
        return None


def build(entries: Sequence[Entry], *, heads: bool, url: str, skipped: int = 0) -> LsTable:
    """The table of ``entries`` (in the order given) of the root at ``url``; ``heads``: whether their heads were
    read (an unread figure shows "-", an unreadable one "?"); ``skipped``: objects the listing passed over."""
    unread = "?" if heads else "-"
    cells = [
        (
            shown(e.module),
            e.hash[:12],
            format_bytes(e.size_bytes),
            unread if e.compile_seconds is None else f"{e.compile_seconds} s",
            e.compression.value if e.compression else unread,
            e.status.value if e.status else unread,
        )
        for e in entries
    ]
    fixed = (*HEADERS[:_AGE], *HEADERS[_USED + 1 :])
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(fixed)]
    columns = [i for i in range(len(HEADERS)) if i not in (_AGE, _USED)]

    def pad(row: Sequence[str], which: range) -> str:
        out = [row[j].rjust(widths[j]) if columns[j] in _RIGHT else row[j].ljust(widths[j]) for j in which]
        return _GAP.join(out)

    first, rest = range(_AGE), range(_AGE, len(fixed))
    footer = f"{plural(len(entries), 'entry')}, {format_bytes(sum(e.size_bytes for e in entries))} in {url}"
    if entries:
        footer = f"{USED_NOTE}\n{footer}"
    if not heads:
        footer += f"\n{heads_note('compile seconds, compression and status')}"
    if skipped:
        footer += f"\n{skipped_note(skipped)}"
    return LsTable(
        head_before=pad(fixed, first) + _GAP, head_after=pad(fixed, rest).rstrip(),
        before=[pad(row, first) + _GAP for row in cells], after=[pad(row, rest).rstrip() for row in cells],
        created_s=[e.mtime_s for e in entries],
        used_s=[e.last_used_s if e.atime_ns is not None else None for e in entries],
        footer=footer,
    )


def heads_note(figures: str) -> str:
    """The line that says heads were not read, and how to get ``figures`` (what they give)."""
    return (f"heads not read (a request per entry in an object store): --heads shows {figures} (each object's head "
            "read once: the head index keeps it)")


def skipped_note(count: int) -> str:
    """The line that says a listing skipped ``count`` objects, and where to see which."""
    return (f"skipped {plural(count, 'object')} named like entries that are not regular files or whose names cannot"
            " be read safely: `jaxcache doctor ROOT` lists them")


def _column(header: str, now: float, times: Sequence[float | None]) -> tuple[str, list[str]]:
    """An age column as of ``now``: its header cell and each row's cell (``format_duration(now - t)``, "-" for
    None), right-aligned to the widest and followed by the gap to the next column. Each text is formatted once:
    below an hour once per whole second, above it once per minute or hour it shows (a column of 100k last uses has
    as many distinct seconds, but not texts); then padded once."""
    memo: dict[int, str] = {}

    def age(t: float | None) -> str:
        if t is None:
            return "-"
        s = int(now - t) if t < now else 0
        # "5h 3m" and "2d 4h" show no seconds, resp. minutes: the text is the minute's, resp. the hour's. Their
        # second unit can be zero ("5h 12s"): then the second counts, as it does below an hour.
        if s < 3600:
            k = s
        elif s < 86400:
            k = s - s % 60 if s % 3600 >= 60 else s
        else:
            k = s - s % 3600 if s % 86400 >= 3600 else s
        text = memo.get(k)
        if text is None:
            text = memo[k] = format_duration(s)
        return text

    cells = [age(t) for t in times]
    texts = set(cells)
    width = max(len(header), *map(len, texts)) if texts else len(header)
    padded = {text: text.rjust(width) + _GAP for text in texts}
    return header.rjust(width) + _GAP, [padded[c] for c in cells]
