"""Is a cache directory safe to load executables from?

JAX executes what it loads from the cache, so anyone who can write the directory can run code in the job
(JAX's own docs say so). A directory is trusted when only this user or root can change what it holds: it is
not group- or world-writable and is owned by us or root. The parents matter too: whoever can rename a parent
can swap the whole directory, unless the parent has the sticky bit (like /tmp), which forbids renaming other
users' entries. A directory that does not exist yet is judged by the parent it will be created under, then
again once created (so a directory someone else slipped in first is caught). A symbolic link on the way is never
taken on another user's word: one owned by anyone but this user or root is a problem (its owner can point it
elsewhere after the check), and the directory judged is the one the path resolves to.
"""

from __future__ import annotations

import logging
import os
import stat

from jaxcache.client.errors import UntrustedCacheDirError

log = logging.getLogger("jaxcache.client")

TRUST_MODES = ("strict", "warn", "off")
_bucket_notice_given = False


def problems(path: str) -> list[str]:
    """Why ``path`` (absolute, normalised) is not trustworthy; empty when it is. The links on the way are judged by
    their owners, then the directories of the path they resolve to (:func:`os.path.realpath`)."""
    me = os.geteuid()
    found = _links(path, me)
    current = os.path.realpath(path)
    is_target = True
    while True:
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            parent = os.path.dirname(current)
            if parent == current:
                break
            # Not there yet: it will be created under the nearest existing ancestor, then judged itself.
            current, is_target = parent, False
            continue
        except OSError as exc:
            found.append(f"cannot inspect {current}: {exc.strerror}")
            break
        found.extend(_judge(current, st, me, is_target))
        parent = os.path.dirname(current)
        if parent == current:
            break
        current, is_target = parent, False
    return found


def _links(path: str, me: int) -> list[str]:
    """The links along ``path`` (as spelled) that another user owns: whoever owns a link can re-point it."""
    found = []
    current = os.sep
    for part in path.split(os.sep):
        if not part:
            continue
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except OSError:
            break  # not there yet: nothing further on the way exists either
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
            found.append(f"{current} is a symbolic link owned by uid {st.st_uid}, not by you (uid {me}) or root")
    return found


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
    if not found:
        return
    message = untrusted_message(cache_dir, found)
    if mode == "strict":
        raise UntrustedCacheDirError(message)
    log.warning("jaxcache: %s", message)
