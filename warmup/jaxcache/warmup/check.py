"""``warmup --check``: on a node of the target cluster, how much of the job the shared cache covers, and why each
miss missed (against the root's run and warm-up records). It writes nothing: the node learns, before the real job
starts, that the warm-up machine's driver, flags or devices differ from its own. With ``JAXCACHE_TRUSTED_KEYS`` set,
as for a job that verifies (``verify="signed"``), a program whose entry no trusted key signed is a miss too: that
job would skip its entry and compile it. A bundle file in place of the root is first imported, checked as `jaxcache
bundle import` checks it, into a temporary directory the check then reads."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jaxcache import signing
from jaxcache.bundle_import import Imported, import_bundle
from jaxcache.coverage import PRESENT, ProgramCoverage, WarmupRecord
from jaxcache.entry import cache_name
from jaxcache.errors import InvalidInputError
from jaxcache.explain.from_root import read_records
from jaxcache.explain.text import blocks
from jaxcache.storage import LocalStorage, Storage, open_storage
from jaxcache.units import plural
from jaxcache.warmup.misses import explained, miss_of, program_dict
from jaxcache.warmup.runner import WarmupConfig


def check_summary(config: WarmupConfig, record: WarmupRecord) -> dict[str, Any]:
    """Coverage (programs that hit / all) and every miss with its cause and fix."""
    storage = open_storage(config.cache_dir, must_exist=False)
    missed = [p for p in record.programs if p.status != PRESENT]
    knowns, _ = read_records(storage)
    misses = [miss_of(program_dict(p), record.fingerprint, run_id=record.id, job=config.job,
                      topology=record.topology) for p in missed]
    found = explained(storage, misses, knowns)
    seconds = {p.key: p.compile_s for p in missed}  # what the job would spend compiling each, as this node did
    for m in found:
        m["compile_s"] = seconds.get(m["key"])
    trusted = signing.TrustedKeys.from_env()
    unsigned = _unsigned(storage, [p for p in record.programs if p.status == PRESENT], trusted) if trusted else []
    programs = len(record.programs)
    hits = programs - len(missed) - len(unsigned)
    found += unsigned
    return {"cache_dir": config.cache_dir, "topology": record.topology, "platform": record.platform,
            "programs": programs, "hits": hits, "coverage": hits / programs if programs else None,
            "misses": found, "fingerprint": record.fingerprint.as_dict()}


def check_text(s: dict[str, Any]) -> str:
    if not s["programs"]:
        return "check: the target compiled nothing: no program to look up (does the entrypoint call jax.jit?)"
    head = (f"check: {s['hits']} of {plural(s['programs'], 'program')} hit in {s['cache_dir']} "
            f"({100 * s['coverage']:.0f}%) on {s['topology']} {s['platform']}; nothing was written")
    if not s["misses"]:
        return head
    return f"{head}\n\n{blocks(s['misses'])}"


def _unsigned(storage: Storage, present: list[ProgramCoverage], trusted: signing.TrustedKeys) -> list[dict[str, Any]]:
    """The programs a ``verify="signed"`` job would skip: their entry's bytes match no trusted signature."""
    out: list[dict[str, Any]] = []
    for p in present:
        data = storage.read(cache_name(p.key))
        why = signing.read(storage, p.key, trusted).judge(data) if data is not None else "gone"
        if why is not None:
            out.append({"function": p.function, "key": p.key, "cause": "skipped", "why": why, "differs": [],
                        "nearest": None,
                        "fix": f"a job with verify='signed' would compile it ({why}): have a trusted writer sign it "
                               f"(jaxcache keys sign ROOT --key K), or remove it so a signing warm-up writes it"})
    return out


@dataclass(frozen=True, slots=True)
class BundleRoot:
    """A bundle checked and imported into a temporary directory, for ``--check`` to read as its root."""

    path: str
    imported: Imported

    def text(self) -> str:
        done = self.imported
        refused = "".join(f"\n  refused {k}: {why}" for k, why in done.refused.items())
        return (f"check: bundle {self.path} imported into a temporary directory: {plural(len(done.imported), 'entry')},"
                f" {len(done.refused)} refused; {done.check_text()}{refused}")


@contextlib.contextmanager
def bundle_root(args: argparse.Namespace) -> Iterator[BundleRoot]:
    """``--cache-dir`` names a bundle file: import it, checked as `jaxcache bundle import` checks, into a temporary
    directory that ``args.cache_dir`` then names while the block runs."""
    if not args.check:
        raise InvalidInputError(f"--cache-dir {args.cache_dir} is a file: only --check takes a bundle in place of a"
                                " cache root")
    path = args.cache_dir
    with tempfile.TemporaryDirectory(prefix="jaxcache-bundle-check-") as tmp:
        imported = import_bundle(path, LocalStorage(tmp), signing.TrustedKeys.from_env())
        args.cache_dir = tmp
        yield BundleRoot(path, imported)
