"""Entries a job refused to load (``enable_cache(verify=...)``): how its run record says so, and what removes them.

A refused entry is a miss: JAX compiles the program and, finding the file there, writes nothing over it (it never
overwrites), so every verifying job skips it again until it is removed. The run record marks such a key by its
``reason``: ``"skipped: <why>"``, where ``why`` is short and stable (a class the service judged, or what the
signature check found), so the summary, ``jaxcache explain`` and the service count misses by it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Final

from jaxcache.storage import is_object_store, removal_command

PREFIX: Final = "skipped: "
#: Why a job skips an entry with ``verify="attested"``: the service's integrity classes that prove it bad, as for
#: prunes. ``differs`` (against an unsigned digest, which anyone with a report token or the bucket could have
#: written) proves nothing: acting on it would let such a writer make every job compile a program.
TAMPERED, MISMATCHED, CORRUPT = "tampered", "mismatched", "corrupt"
JUDGED_BAD: tuple[str, ...] = (TAMPERED, MISMATCHED, CORRUPT)
#: Why a job skips an entry with ``verify="signed"`` (the signature check's words).
UNSIGNED, UNTRUSTED_KEY, BAD_SIGNATURE, DIGEST_DIFFERS = "unsigned", "untrusted key", "bad signature", "digest differs"
_MAX_WHY = 200


def reason(why: str) -> str:
    """The run record's ``reason`` for a key skipped because of ``why``."""
    return PREFIX + " ".join(why.split())[:_MAX_WHY]


def why_skipped(reason_text: str | None) -> str | None:
    """``why`` when a run record's reason says the job skipped the key's entry, else None."""
    if reason_text is None or not reason_text.startswith(PREFIX):
        return None
    return reason_text[len(PREFIX):] or "unknown"


def removal(root: str, skipped: Mapping[str, str], *, shown: int = 10) -> str:
    """The command that removes the entries of ``skipped`` (key → why) from ``root``: ``prune --integrity`` when
    the service's classes are why, and always the entries' own files (``rm``, or the object store's own command
    line). Their signatures go too: one left behind would refuse the next writer's (signatures are created only
    once), and every signed job would skip the key again."""
    if not skipped:
        return ""
    keys = sorted(skipped)
    sep = "" if root.endswith("/") else "/"
    more = f" (and {len(keys) - shown} more)" if len(keys) > shown else ""
    if is_object_store(root):  # the store's own command line: the entry, its -sig and -atime where there
        delete = removal_command(root.rstrip("/"), [f"{key}-*" for key in keys[:shown]]) + more
    else:
        files = " ".join(shlex.quote(f"{root}{sep}{key}{suffix}") for key in keys[:shown]
                         for suffix in ("-cache", "-sig"))
        delete = f"rm -f {files}{more}"
    if all(why in JUDGED_BAD for why in skipped.values()):
        return f"jaxcache prune {shlex.quote(root)} --integrity {','.join(JUDGED_BAD)} --apply (or {delete})"
    return delete
