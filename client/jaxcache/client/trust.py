"""Is a cache directory safe to load executables from?

JAX executes what it loads from the cache, so anyone who can write the directory can run code in the job
(JAX's own docs say so). A directory is trusted when only this user or root can change what it holds: it is
not group- or world-writable and is owned by us or root. The parents matter too: whoever can rename a parent
can swap the whole directory, unless the parent has the sticky bit (like /tmp), which forbids renaming other
users' entries. A directory that does not exist yet is judged by the parent it will be created under, then
again once created (so a directory someone else slipped in first is caught). The path is judged as the user spelled
it, before anything resolves it: a symbolic link on the way owned by anyone but this user or root is a problem (its
owner can point it elsewhere after the check), and so is each folder on the way, and where the links lead.
"""

from __future__ import annotations

import logging
import os
import stat

from jaxcache.client.errors import UntrustedCacheDirError
from jaxcache.storage import named

log = logging.getLogger("jaxcache.client")

TRUST_MODES = ("strict", "warn", "off")
_bucket_notice_given = False


def problems(path: str) -> list[str]:
    """Why ``path`` is not trustworthy; empty when it is. ``path`` is absolute and as the user spelled it
    (:func:`jaxcache.storage.spelled_root`), never resolved first: each link on the way is judged by its owner, each
    folder a name is looked up in (along the path and the links' targets) as a parent, then where it leads as the
    cache directory (not there yet: the folder it will be made in, as a parent)."""
    me = os.geteuid()
    found = named.walk(path)
    out = named.links_problems(found)
    if found.target is not None:
        out.extend(_judge(found.target.path, found.target.st, me, is_target=True))
    for step in reversed(found.dirs):  # the nearest first
        out.extend(_judge(step.path, step.st, me, is_target=False))
    return list(dict.fromkeys(out))  # a folder met twice on the way is said once


def _judge(path: str, st: os.stat_result, me: int, is_target: bool) -> list[str]:
    sticky = bool(st.st_mode & stat.S_ISVTX)
    found = []
    if st.st_uid not in (0, me):
        found.append(f"{path} is owned by uid {st.st_uid}, not by you (uid {me}) or root")
    writable_by = [who for bit, who in ((stat.S_IWGRP, "its group"), (stat.S_IWOTH, "everyone")) if st.st_mode & bit]
    # The sticky bit stops others renaming what we own inside a parent, but not adding new files to the cache
    # itself: a planted file under a key name is exactly the attack.
    if writable_by and (is_target or not sticky):
        found.append(f"{path} is writable by {' and '.join(writable_by)} (mode {stat.S_IMODE(st.st_mode):o})")
    return found


def advice(path: str) -> str:
    """How to fix an untrusted directory."""
    return (
        f"use a directory only you (or root) can write, e.g. `chmod go-w {path}`, or mount the shared cache"
        " read-only for jobs and let one trusted writer (warm-up) fill it; pass trust='warn' or 'off' to"
        " enable_cache() only if everyone who can write there may run code in this job"
    )


def untrusted_message(directory: str, found: list[str]) -> str:
    """Why a directory is refused, and the fix."""
    return (
        f"the cache directory {directory} is not trustworthy: {'; '.join(found)}. JAX executes what it"
        " loads from there, so whoever can write it can run code in this job."
        f" Fix: {advice(directory)}"
    )


def make_private_dirs(path: str) -> None:
    """Create ``path`` and missing parents as ours, not group-writable whatever the umask."""
    missing = []
    current = path
    while not os.path.exists(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o755)


def check(cache_dir: str, *, mode: str, in_object_store: bool) -> None:
    """Apply the trust mode to the cache: ``strict`` raises :class:`UntrustedCacheDirError` with the fix, ``warn``
    logs it, ``off`` skips; a bucket gets one notice that its IAM must restrict writers."""
    global _bucket_notice_given
    if mode == "off":
        return
    if in_object_store:
        if not _bucket_notice_given:
            _bucket_notice_given = True
            log.info("jaxcache: %s is a bucket: JAX runs what it loads from it, so its access policy (IAM, bucket"
                     " policy, role assignments) must let only trusted writers (the warm-up and process 0 of your jobs)"
                     " create objects there", cache_dir)
        return
    found = problems(cache_dir)
    if not found and not os.path.isdir(cache_dir):
        try:
            make_private_dirs(cache_dir)
        except OSError as exc:
            raise UntrustedCacheDirError(f"cannot create the cache directory {cache_dir}: {exc.strerror}") from None
        found = problems(cache_dir)
    if found:
        verdict(cache_dir, found, mode)


def verdict(directory: str, found: list[str], mode: str) -> None:
    """What the trust mode does with a directory's problems: ``strict`` raises :class:`UntrustedCacheDirError`,
    ``warn`` logs them."""
    message = untrusted_message(directory, found)
    if mode == "strict":
        raise UntrustedCacheDirError(message)
    log.warning("jaxcache: %s", message)
