"""Real-format cache entries for the benchmarks: real JAX entry bytes (from ``python -m jaxcache.warmup.demo`` or
a given cache) copied under many distinct keys, with an ``-atime`` file each."""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
import sys
import time

_NAME_RE = re.compile(r"(?P<module>.+)-(?P<hash>[0-9a-f]{64})-cache")
_MAX_SOURCES = 64


def make_source(workdir: str) -> str:
    """Fill ``workdir/source`` with a real JAX cache via ``python -m jaxcache.warmup.demo``."""
    source = os.path.join(workdir, "source")
    print(f"generating a real JAX cache in {source} (python -m jaxcache.warmup.demo) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "jaxcache.warmup.demo", source], check=True,
                   env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return source


def load_sources(source: str) -> list[tuple[str, bytes]]:
    """``(module, bytes)`` of up to ``_MAX_SOURCES`` real ``-cache`` files, sorted by name."""
    found = []
    for name in sorted(os.listdir(source)):
        m = _NAME_RE.fullmatch(name)
        if m is None:
            continue
        with open(os.path.join(source, name), "rb") as f:
            found.append((m["module"], f.read()))
        if len(found) >= _MAX_SOURCES:
            break
    if not found:
        sys.exit(f"error: no <module>-<64 hex>-cache files in {source}")
    return found


class Progress:
    """tqdm on a terminal; otherwise a line on stderr every 10%."""

    def __init__(self, total: int, desc: str) -> None:
        self.total, self.desc, self.done, self.next_pct = total, desc, 0, 10
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="entry", unit_scale=True, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        while self.total and self.done * 100 >= self.next_pct * self.total and self.next_pct <= 100:
            print(f"{self.desc}: {self.next_pct}% ({self.done}/{self.total})", file=sys.stderr)
            self.next_pct += 10

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def key_of(module: str, i: int) -> str:
    """Entry ``i``'s key: ``<module>-<sha256(str(i))>``, the same in every benchmark."""
    return f"{module}-{hashlib.sha256(str(i).encode()).hexdigest()}"


def build_root(sources: list[tuple[str, bytes]], root: str, entries: int) -> None:
    """Write ``entries`` entries into ``root``: entry ``i`` has the bytes of source ``i % len(sources)`` and an
    ``-atime`` ``i`` seconds in the past."""
    os.makedirs(root)
    now = time.time_ns()
    for i in range(entries):
        module, data = sources[i % len(sources)]
        key = key_of(module, i)
        write(os.path.join(root, key + "-cache"), data)
        write(os.path.join(root, key + "-atime"), struct.pack("<Q", now - i * 1_000_000_000))
        if (i + 1) % max(entries // 10, 1) == 0:
            print(f"built {i + 1}/{entries}", file=sys.stderr)
