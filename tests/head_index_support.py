"""Helpers of the head index tests: a CLI call's JSON, one indexed scan and its reads, an entry garbled in place."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jaxcache.cli import main
from jaxcache.head_index import HeadIndex, Snapshot
from jaxcache.scan_indexed import scan_indexed
from jaxcache.storage import open_storage


def run_json(capsys, *argv: str) -> tuple[dict, str]:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def by_key(data: dict) -> dict[str, dict]:
    return {e["key"]: e for e in data["entries"]}


def listed(root: str, **kwargs) -> tuple[list, int]:
    """One indexed scan of ``root``: its records and how many object reads it made."""
    storage = open_storage(root)
    index = HeadIndex.for_storage(storage)
    assert index is not None
    records = list(scan_indexed(storage, index, **kwargs))
    return records, storage.reads


def garble_keeping_stamp(path: Path) -> None:
    """Same size, same mtime, other bytes: only the index can still know what the entry held."""
    st = path.stat()
    path.write_bytes(b"\x01" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def forget_answers(index_dir: Path) -> None:
    for kept in [*index_dir.glob("*.ls"), *index_dir.glob("*.stats")]:
        kept.unlink()


def index_snapshot(root: str) -> Snapshot:
    index = HeadIndex.for_storage(open_storage(root))
    assert index is not None
    snapshot = index.load()
    assert snapshot is not None
    return snapshot
