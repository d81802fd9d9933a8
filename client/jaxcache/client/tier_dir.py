"""Where the node-local tier lives: the first candidate directory that is this user's alone, checked and resolved,
so that JAX reads the very directory that was judged (:mod:`jaxcache.client.local_tier` runs the tier in it)."""

from __future__ import annotations

import logging
import os

from jaxcache.client import trust as trust_mod
from jaxcache.client.loads import LoadPolicy
from jaxcache.client.options import ClientOptions
from jaxcache.signing import TrustedKeys

log = logging.getLogger("jaxcache.client")


def policy_name(policy: LoadPolicy | None, trusted: TrustedKeys) -> str:
    """The subdirectory of one trust policy: what a job admits decides which files it may share."""
    if policy is None:
        return "unchecked"
    if policy.mode == "signed":
        return f"signed-{trusted.digest()[:12]}"  # other trusted keys, other proof
    return policy.mode


def open_dir(candidates: tuple[str, ...], policy: str, trust: str, *,
             named: bool = False) -> tuple[str | None, list[str]]:
    """The first candidate whose policy subdirectory can be made private (0700), written, and trusted, or None; the
    directory is the one checked, resolved (no link in it), so JAX reads what was judged. With it, the default
    candidates passed over as not trustworthy, and why.

    Each candidate is judged as spelled (its links and folders), before anything is made in it or resolved. A
    directory the user ``named`` is judged like any cache directory (``trust``: strict raises). A default
    candidate that is not trustworthy (another user's directory or link there: on a shared temp dir anyone can
    make ``jaxcache-<uid>`` first) is passed over like one that cannot be written, with one warning."""
    passed: list[str] = []
    for base in candidates:
        path = os.path.join(base, policy)
        # As spelled, before creating anything in another user's tree or through another user's link.
        found = trust_mod.problems(path) if trust != "off" else []
        if found and not named:
            passed.append(f"{base} ({'; '.join(found)})")
            continue
        if found:
            trust_mod.verdict(path, found, trust)  # strict: refused; warn: said once, and used
        try:
            # 0700 on what this process creates (a base that was there keeps its mode: it may be a user's folder).
            os.makedirs(base, mode=0o700, exist_ok=True)
            os.makedirs(path, mode=0o700, exist_ok=True)
            real = os.path.realpath(path)
            _make_private(real)
        except OSError as exc:
            log.debug("jaxcache: %s cannot hold the node-local tier: %s", path, exc)
            continue
        if named:
            if not found:  # JAX executes what it loads from here: judged again once made (someone may slip in)
                trust_mod.check(path, mode=trust, in_object_store=False)
        elif trust != "off" and (found := trust_mod.problems(path)):
            passed.append(f"{base} ({'; '.join(found)})")  # someone slipped in meanwhile
            continue
        return real, passed
    return None, passed


def _make_private(path: str) -> None:
    """Open ``path`` itself (never through a link), make it 0700 when it is ours, and write a file in it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o700)
        probe = f".jaxcache-probe-{os.getpid()}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=fd))
        os.unlink(probe, dir_fd=fd)
    finally:
        os.close(fd)


def open_local_dir(options: ClientOptions, loads: LoadPolicy | None) -> str | None:
    """The node-local directory JAX is to read for this job's trust policy, or None: no tier asked for, or no
    candidate usable here (a read-only pod file system: then one warning, and JAX reads the root directly)."""
    if not options.local_dirs:
        return None
    found, passed = open_dir(options.local_dirs, policy_name(loads, options.trusted_keys), options.trust,
                             named=options.local_dir_named)
    # One warning either way: JAX executes what it loads from there, so a directory that is not only this user's
    # is passed over like one that cannot be written.
    others = "" if not passed else f"; not only yours, so not used: {', '.join(passed)}"
    if found is None:
        log.warning("jaxcache: no node-local directory is writable here (tried %s%s): JAX reads %s directly, without"
                    " the node-local tier; set JAXCACHE_LOCAL_DIR to a writable directory of yours, or to off",
                    ", ".join(options.local_dirs), others, options.cache_dir)
    elif passed:
        log.warning("jaxcache: the node-local tier is at %s%s", found, others)
    return found
