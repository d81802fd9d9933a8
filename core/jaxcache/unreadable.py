"""Entries JAX could not load: how a run record says a miss met one, how an entry's age tells one, what removes it.

JAX warns, recompiles and, finding the file there, writes nothing over it: such an entry is a miss for every job
until it is removed. The client's exit summary (:mod:`jaxcache.client.misses`) and ``jaxcache explain`` (the CLI's
and the service's, :mod:`jaxcache.explain`) decide it and advise on it with this module alone, so the two never
name different causes or fixes for one entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from jaxcache import skips

#: A run record's ``reason`` for a key JAX said it wrote while its entry was there already (found as JAX went to put
#: it, or older than the lookup): those bytes are not the process's, and its miss met an entry JAX could not load.
REASON: Final = ("the cache holds an entry for this key that JAX could not load; JAX does not rewrite an entry"
                 " that exists")

#: How much older than a lookup an entry must look to have been there before it. An entry's mtime comes from the
#: store's clock (the NFS server's, the bucket's), the lookup's time from the process's, and the mtime may be cut to
#: whole seconds (S3's and Azure's Last-Modified, which jaxcache.storage reads as whole seconds, and file systems
#: with 1 s timestamps): an entry this process writes 0.1 s after its lookup can read as up to 1 s older than it
#: was written, so anything under that second plus a clock difference of up to a second between the two would call
#: the process's own fresh write "there before" (and leave it unattested, and explain its miss as unreadable). NTP
#: keeps hosts and stores well within that second. What the slack costs: an entry someone else wrote less than 2 s
#: before the lookup is not taken as there before; the client then checks what JAX wrote as its own write.
SLACK_S: Final = 2.0


def there_before(mtime_s: float, looked_up_at: float) -> bool:
    """Whether an entry of this mtime was in the cache before a lookup at ``looked_up_at`` (the process's
    ``time.time()``): older than it by more than :data:`SLACK_S`."""
    return mtime_s < looked_up_at - SLACK_S


def said(reason: str | None) -> bool:
    """Whether a run record's ``reason`` says the key's entry was there, and JAX could not load it."""
    return reason == REASON


def fix(root: str, keys: Iterable[str], problem: str | None = None) -> str:
    """The advice for the entries of ``keys`` in ``root`` that JAX could not load (``problem``: what is wrong with
    the one entry, where it was read): the command that removes exactly them. ``jaxcache prune --corrupt`` would
    miss an entry torn after a head that decodes, and spares entries younger than its ``--min-age``."""
    found = sorted(set(keys))
    one = len(found) == 1
    return (f"{'the entry is' if one else 'each entry is'} in the cache but JAX could not load it"
            + (f" ({problem})" if problem else "")
            + f"; JAX recompiles it every time and never rewrites it: remove {'it' if one else 'them'}:"
            f" {skips.removal(root, dict.fromkeys(found, 'unreadable'))}")
