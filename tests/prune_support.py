"""What the prune tests share: hand-made candidates, aged copies of real caches, the CLI run in-process."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from conftest import TESTS
from jaxcache import entry as fmt
from jaxcache.cli import main
from jaxcache.prune import (
    Candidate,
    Decision,
)

NOW = 1_800_000_000.0
DAY = 86400.0
HOUR = 3600.0
ORPHAN_KEY = "jit_gone-" + "0" * 64
JOB = TESTS / "programs" / "jax_job.py"


def cand(
    module: str = "jit_f", n: int = 0, *, size: int = 100, created_ago: float = 30 * DAY,
    used_ago: float | None = None, status: str | None = "ok", orphan: bool = False,
) -> Candidate:
    """A candidate with a real-shaped key; ages are relative to NOW."""
    key = f"{module}-{hashlib.sha256(f'{module}{n}'.encode()).hexdigest()}"
    used = created_ago if used_ago is None else used_ago
    return Candidate(
        key=key, module=module, name=key + ("-atime" if orphan else "-cache"), size_bytes=size,
        created_s=NOW - created_ago, last_used_s=NOW - used, status=None if orphan else status, orphan=orphan,
        has_atime=not orphan,
    )


def keys(decisions: list[Decision]) -> list[str]:
    return [d.candidate.key for d in decisions]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name → bytes): the full state a prune may change."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def age_cache(root: Path, *, created_ago: float, used_ago: dict[str, float] | float, now: float) -> list[str]:
    """Set every entry's mtime and ``-atime`` content explicitly; returns the keys."""
    found = sorted(p.name[:-6] for p in root.iterdir() if p.name.endswith("-cache"))
    for key in found:
        ago = used_ago if isinstance(used_ago, float | int) else used_ago.get(key, created_ago)
        (root / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - ago) * 1e9)))
        for suffix in ("-cache", "-atime"):
            os.utime(root / f"{key}{suffix}", (now - created_ago, now - created_ago))
    return found


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def small_sources(cache_dir: str | Path, limit_bytes: int = 64 * 1024) -> list[tuple[str, bytes]]:
    """(module, bytes) of the real entries in a cache that are small enough to copy thousands of times."""
    found = []
    for p in sorted(Path(cache_dir).iterdir()):
        parsed = fmt.parse_name(p.name)
        if parsed is not None and parsed.kind is fmt.EntryKind.CACHE and p.stat().st_size <= limit_bytes:
            found.append((parsed.module, p.read_bytes()))
    assert found
    return found


def build_synthetic(root: Path, sources: list[tuple[str, bytes]], n: int, now: float) -> None:
    """``n`` real-format entries under distinct keys, each with an ``-atime``; deterministic ages.

    Entry ``i``: created 60 days ago; last used ``i % 30`` days (plus ``i`` seconds) ago.
    """
    root.mkdir()
    for i in range(n):
        module, data = sources[i % len(sources)]
        key = f"{module}-{hashlib.sha256(str(i).encode()).hexdigest()}"
        (root / f"{key}-cache").write_bytes(data)
        (root / f"{key}-atime").write_bytes(fmt.encode_atime(int((now - (i % 30) * DAY - i) * 1e9)))
        for suffix in ("-cache", "-atime"):
            os.utime(root / f"{key}{suffix}", (now - 60 * DAY, now - 60 * DAY))
