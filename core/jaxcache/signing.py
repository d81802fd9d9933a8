"""Ed25519 signing keys, trusted public keys, and the ``<key>-sig`` objects that sit beside entries.

The Nix binary-cache model (docs/user-guide.md, "Integrity"): writers sign with a private key file
(JAXCACHE_SIGNING_KEY), readers trust public keys (JAXCACHE_TRUSTED_KEYS, ``NAME:base64`` each). A signature covers
the cache key, the entry's sha256 and size, and the signing key's name; which job wrote the entry is information
beside it, never part of what is proven. ``cryptography`` is imported only when a key is used:
``import jaxcache.client`` stays light.
"""

from __future__ import annotations

import base64
import binascii
import errno
import grp
import hashlib
import json
import os
import pwd
import re
import stat
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from jaxcache import skips
from jaxcache.entry import is_valid_key
from jaxcache.errors import EncodedObjectError, InvalidInputError, NotRegularFileError, PreconditionFailedError
from jaxcache.storage.base import Storage
from jaxcache.storage.named import read_named

SIGNING_KEY_ENV = "JAXCACHE_SIGNING_KEY"
TRUSTED_KEYS_ENV = "JAXCACHE_TRUSTED_KEYS"
SIG_SUFFIX = "-sig"
FORMAT = "jaxcache-sig/1"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_KEY_FILE_BYTES = 4096  # a key file is one line of some 60 bytes
MAX_SIG_BYTES = 64 * 1024  # a -sig object holds a few signatures; anything bigger is not one of ours


def sig_name(key: str) -> str:
    """The object name of a key's signatures."""
    return key + SIG_SUFFIX


def key_of_sig(name: str) -> str | None:
    """The cache key a ``<key>-sig`` object name belongs to, or None when the name is not one."""
    if not name.endswith(SIG_SUFFIX) or "/" in name:
        return None
    key = name[: -len(SIG_SUFFIX)]
    return key if is_valid_key(key) else None


def check_key_name(name: str) -> str:
    """A signing key's name, or InvalidInputError saying what a name may hold."""
    if not _NAME.fullmatch(name):
        raise InvalidInputError(f"invalid key name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting"
                                " with a letter or digit (e.g. ci-2026)")
    return name


def message(key: str, sha256: str, size_bytes: int, signer: str) -> bytes:
    """The bytes a signature covers: the cache key, the entry's digest and size, and the signing key's name."""
    return f"{FORMAT}\0{key}\0{sha256}\0{size_bytes}\0{signer}".encode()


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError(f"{what} is not valid base64") from None


@dataclass(frozen=True, slots=True)
class Signature:
    """One key's signature of one entry; ``writer`` and ``at`` are information, not part of what is signed."""

    key: str
    sha256: str
    size_bytes: int
    signer: str
    signature: str  # base64 of the Ed25519 signature of :func:`message`
    writer: str | None = None
    at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The signature as it is stored in a ``-sig`` object."""
        out: dict[str, Any] = {"key": self.key, "sha256": self.sha256, "size_bytes": self.size_bytes,
                               "signer": self.signer, "signature": self.signature}
        if self.writer is not None:
            out["writer"] = self.writer
        if self.at is not None:
            out["at"] = self.at
        return out


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A private key and its name (the file ``jaxcache keys new`` writes: ``NAME:base64-of-the-32-byte-seed``)."""

    name: str
    seed: bytes = field(repr=False)

    def public_text(self) -> str:
        """``NAME:base64``: what readers put in JAXCACHE_TRUSTED_KEYS."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        public = Ed25519PrivateKey.from_private_bytes(self.seed).public_key().public_bytes(Encoding.Raw,
                                                                                           PublicFormat.Raw)
        return f"{self.name}:{base64.b64encode(public).decode()}"

    def sign(self, key: str, sha256: str, size_bytes: int, *, writer: str | None = None) -> Signature:
        """This key's signature of ``key``'s entry with that digest and size."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        raw = Ed25519PrivateKey.from_private_bytes(self.seed).sign(message(key, sha256, size_bytes, self.name))
        return Signature(key, sha256, size_bytes, self.name, base64.b64encode(raw).decode(), writer, time.time())


def new_key(name: str, path: str) -> SigningKey:
    """Make a key called ``name`` and write it to ``path`` (mode 0600; an existing file is never overwritten)."""
    check_key_name(name)
    seed = os.urandom(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInputError(f"{path} exists: jaxcache never overwrites a key file; choose another path") from None
    except OSError as exc:
        raise InvalidInputError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{name}:{base64.b64encode(seed).decode()}\n")
    return SigningKey(name, seed)


def load_key(path: str) -> SigningKey:
    """Read a private key file written by ``jaxcache keys new``; refused, in one line with the command that fixes
    it, when anyone but its owner and group may read it or anyone but its owner may write it: by its mode, by a POSIX
    ACL (which the mode does not show), or because its owner is another user (who could rewrite it). Group read
    stays allowed, and an owner root: a Kubernetes Secret's files are root's, mounted with defaultMode 0440 and read
    by a non-root pod through its fsGroup."""
    # Judged as named (a link another user owns is not followed), never waiting on a FIFO; the owner, mode and ACL
    # of the file opened, not of a name swapped after.
    data = read_named(path, "the signing key", MAX_KEY_FILE_BYTES, check=lambda fd, found: _exposed(path, fd, found))
    try:
        text = data.decode().strip()
    except UnicodeDecodeError:
        text = ""
    name, sep, body = text.partition(":")
    if not sep:
        raise InvalidInputError(f"{path} is not a jaxcache signing key (expected NAME:base64, as `jaxcache keys new`"
                                " writes)")
    seed = _b64(body, f"the signing key in {path}")
    if len(seed) != 32:
        raise InvalidInputError(f"{path} is not a jaxcache signing key: its key is {len(seed)} bytes, not 32")
    return SigningKey(check_key_name(name), seed)


# POSIX ACLs as Linux stores them in this extended attribute (acl/include/acl_ea.h): a 4-byte little-endian version,
# then 8-byte entries of tag, permissions (u16 each) and the user or group id (u32).
_ACL_XATTR = "system.posix_acl_access"
_ACL_VERSION = 2
_ACL_USER, _ACL_GROUP, _ACL_MASK = 0x02, 0x08, 0x10
_ACL_READ, _ACL_WRITE = 0x4, 0x2
_NO_ACL = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP})


def _exposed(path: str, fd: int, found: os.stat_result) -> str | None:
    """Why others could read or rewrite the key file open at ``fd`` (what follows "the signing key PATH"), or None."""
    me = os.geteuid()
    if found.st_uid not in (me, 0):
        return (f"is owned by {_user(found.st_uid)}, who could rewrite it; run chown {_name(me)} {path} as root (or"
                " make a new key: jaxcache keys new)")
    mode = stat.S_IMODE(found.st_mode)
    if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
        who = "other users can read it" if mode & stat.S_IROTH else "users other than its owner can write it"
        return (f"has mode {mode:04o}: {who}; run chmod 600 {path} (or 0440 with a group, as a Kubernetes Secret's"
                " defaultMode)")
    granted = _acl_grants(fd, found)
    return None if granted is None else f"has {granted}; run setfacl -b {path}"


def _acl_grants(fd: int, found: os.stat_result) -> str | None:
    """The file's access ACL when it lets anyone but the owner and the file's own group read or write the file
    (said as "an ACL that lets ..."), or None."""
    getxattr = getattr(os, "getxattr", None)  # Linux's; elsewhere ACLs are not read
    if getxattr is None:
        return None
    try:
        raw = getxattr(fd, _ACL_XATTR)
    except OSError as exc:
        if exc.errno in _NO_ACL:  # none, or a file system without ACLs
            return None
        return f"an ACL that cannot be read ({exc.strerror}), so who else may read it is unknown"
    if len(raw) < 4 or (len(raw) - 4) % 8 or int.from_bytes(raw[:4], "little") != _ACL_VERSION:
        return "an ACL in a form jaxcache does not read, so who else may read it is unknown"
    entries = list(struct.iter_unpack("<HHI", raw[4:]))
    # Named entries grant no more than the mask (with an ACL, the mode's group bits show the mask).
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), _ACL_READ | _ACL_WRITE)
    for tag, perm, ident in entries:
        granted = perm & mask
        if not granted & (_ACL_READ | _ACL_WRITE):
            continue
        does = "read" if granted & _ACL_READ else "write"
        if tag == _ACL_USER and ident != found.st_uid:
            return f"an ACL that lets {_user(ident)} {does} it, which its mode ({_mode(found)}) does not show"
        if tag == _ACL_GROUP and ident != found.st_gid:
            return (f"an ACL that lets the group {_group(ident)} {does} it, which its mode ({_mode(found)}) does not"
                    " show")
    return None


def _mode(found: os.stat_result) -> str:
    return f"{stat.S_IMODE(found.st_mode):04o}"


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _user(uid: int) -> str:
    name = _name(uid)
    return f"user {uid}" if name == str(uid) else f"user {name} ({uid})"


def _group(gid: int) -> str:
    try:
        return f"{grp.getgrgid(gid).gr_name} ({gid})"
    except KeyError:
        return str(gid)


def key_from_env(env: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key JAXCACHE_SIGNING_KEY names (a path), or None when it is unset."""
    path = (os.environ if env is None else env).get(SIGNING_KEY_ENV, "")
    try:
        return load_key(path) if path else None
    except InvalidInputError as exc:
        raise InvalidInputError(f"{SIGNING_KEY_ENV}: {exc}") from None


@dataclass(frozen=True, slots=True)
class TrustedKeys:
    """Public keys by name: the signers whose signatures prove an entry's bytes."""

    keys: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> TrustedKeys:
        """``NAME:base64 NAME:base64 ...`` (spaces or newlines between); a malformed one is an error."""
        found: dict[str, bytes] = {}
        for item in text.split():
            name, sep, body = item.partition(":")
            if not sep:
                raise InvalidInputError(f"trusted key {item[:40]!r} is not NAME:base64 (as `jaxcache keys new`"
                                        " prints it)")
            raw = _b64(body, f"trusted key {name!r}")
            if len(raw) != 32:
                raise InvalidInputError(f"trusted key {name!r} is {len(raw)} bytes, not a 32-byte Ed25519 key")
            if found.get(check_key_name(name), raw) != raw:
                raise InvalidInputError(f"trusted key name {name!r} is listed twice with different keys")
            found[name] = raw
        return cls(found)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TrustedKeys:
        """The keys JAXCACHE_TRUSTED_KEYS lists (none when unset)."""
        try:
            return cls.parse((os.environ if env is None else env).get(TRUSTED_KEYS_ENV, ""))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{TRUSTED_KEYS_ENV}: {exc}") from None

    def __bool__(self) -> bool:
        return bool(self.keys)

    def digest(self) -> str:
        """The set's fingerprint: verdicts made under another set of keys are made again."""
        listed = " ".join(f"{name}:{base64.b64encode(raw).decode()}" for name, raw in sorted(self.keys.items()))
        return hashlib.sha256(listed.encode()).hexdigest()

    def check(self, sig: Signature, key: str) -> str | None:
        """None when ``sig`` is a valid signature of ``key``'s entry by a trusted key; else why it proves nothing."""
        if sig.key != key:
            return f"a signature for another key ({sig.key}) was found beside this one: ignored"
        public = self.keys.get(sig.signer)
        if public is None:
            return f"signed by {sig.signer!r}, which is not a trusted key: ignored"
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            raw = base64.b64decode(sig.signature.encode(), validate=True)
            Ed25519PublicKey.from_public_bytes(public).verify(raw, message(key, sig.sha256, sig.size_bytes,
                                                                           sig.signer))
        except (InvalidSignature, binascii.Error, ValueError):
            return f"a signature claiming key {sig.signer!r} does not verify: ignored"
        return None


def encode(sigs: Iterable[Signature]) -> bytes:
    """A ``-sig`` object's bytes."""
    return json.dumps({"format": FORMAT, "signatures": [s.to_json() for s in sigs]}, sort_keys=True).encode()


class _Stored(msgspec.Struct, frozen=True):
    key: str
    sha256: str
    size_bytes: int
    signer: str
    signature: str
    writer: str | None = None
    at: float | None = None


class _Object(msgspec.Struct, frozen=True):
    format: str
    signatures: list[_Stored]


def decode(data: bytes) -> list[Signature]:
    """The signatures in a ``-sig`` object; InvalidInputError when it is not one. Whatever the bytes hold (a
    number out of range, nesting deeper than the interpreter allows, more than :data:`MAX_SIG_BYTES`), the answer
    is that error, so a bad object is a verdict on its own entry and never stops a reader judging the others."""
    if len(data) > MAX_SIG_BYTES:
        raise InvalidInputError(f"not a jaxcache signature object (larger than {MAX_SIG_BYTES} bytes)")
    try:
        doc = msgspec.json.decode(data, type=_Object)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise InvalidInputError(f"not a jaxcache signature object ({str(exc)[:80]})") from None
    if doc.format != FORMAT:
        raise InvalidInputError(f"not a jaxcache signature object (format {doc.format[:40]!r})")
    return [Signature(s.key, s.sha256, s.size_bytes, s.signer, s.signature, s.writer, s.at) for s in doc.signatures]


def read_object(storage: Storage, key: str) -> bytes | None:
    """The bytes of ``key``'s ``-sig`` object (None: there is none), reading at most one byte more than
    :data:`MAX_SIG_BYTES`: a larger object is not one of ours, and is never read whole."""
    return storage.read_range(sig_name(key), 0, MAX_SIG_BYTES + 1)


@dataclass(frozen=True, slots=True)
class Found:
    """What a key's ``-sig`` object holds: signatures that verify against a trusted key, and why others do not."""

    trusted: tuple[Signature, ...] = ()
    notes: tuple[str, ...] = ()
    #: Why each other signature proves nothing, in a word a job's skip reason uses (:mod:`jaxcache.skips`).
    refused: tuple[str, ...] = ()

    def judge(self, data: bytes) -> str | None:
        """None when a trusted signature covers exactly ``data`` (an entry's stored bytes); else why not:
        ``digest differs``, ``bad signature``, ``untrusted key`` or ``unsigned``."""
        if self.trusted:
            digest = hashlib.sha256(data).hexdigest()
            if any(s.sha256 == digest and s.size_bytes == len(data) for s in self.trusted):
                return None
            return skips.DIGEST_DIFFERS
        if skips.BAD_SIGNATURE in self.refused:
            return skips.BAD_SIGNATURE
        return skips.UNTRUSTED_KEY if self.refused else skips.UNSIGNED


def read(storage: Storage, key: str, trusted: TrustedKeys) -> Found:
    """The trusted signatures of ``key``'s entry (one small read; nothing when there is no ``-sig`` object)."""
    try:
        data = read_object(storage, key)
    except EncodedObjectError as exc:  # stored with a Content-Encoding: someone wrote it there, as a malformed one
        return Found(notes=(f"{exc}: ignored",), refused=(skips.BAD_SIGNATURE,))
    except NotRegularFileError:
        return Found(notes=(f"{sig_name(key)} is not a file: ignored",))
    return found_in(data, key, trusted)


def found_in(data: bytes | None, key: str, trusted: TrustedKeys) -> Found:
    """What a ``-sig`` object's bytes (None: there is none) hold for ``key``'s entry, judged as :func:`read` does:
    for signatures that travel without a root (a bundle's ``<key>-sig`` member)."""
    if data is None:
        return Found()
    try:
        sigs = decode(data)
    except InvalidInputError as exc:  # a verdict on this entry alone: a malformed signature proves nothing
        return Found(notes=(f"{sig_name(key)} is {exc}: ignored",), refused=(skips.BAD_SIGNATURE,))
    good, notes, refused = [], [], []
    for sig in sigs:
        why = trusted.check(sig, key)
        if why is None:
            good.append(sig)
        else:
            notes.append(why)
            untrusted = sig.key == key and sig.signer not in trusted.keys
            refused.append(skips.UNTRUSTED_KEY if untrusted else skips.BAD_SIGNATURE)
    return Found(tuple(good), tuple(notes), tuple(refused))


def write(storage: Storage, sig: Signature) -> bool:
    """Store a writer's signature create-only (jobs may create objects, never replace them); False when a
    ``-sig`` object is already there."""
    try:
        storage.write_atomic(sig_name(sig.key), encode([sig]), create_only=True)
    except PreconditionFailedError:
        return False
    return True


def add(storage: Storage, sig: Signature) -> None:
    """Add a signature to a key's ``-sig`` object, keeping the others (an operator's re-signing, which may
    replace the object; a signature by the same key name is replaced)."""
    try:
        data = read_object(storage, sig.key)
        kept = [s for s in decode(data) if s.signer != sig.signer] if data is not None else []
    except InvalidInputError:
        kept = []  # not ours: replaced by a real one
    storage.write_atomic(sig_name(sig.key), encode([*kept, sig]))


def orphans(storage: Storage) -> Iterator[str]:
    """``-sig`` objects whose entry is gone (JAX's own LRU deletes only ``-cache`` and ``-atime``)."""
    for info in storage.iter_objects():
        key = key_of_sig(info.name)
        if key is not None and not storage.exists(key + "-cache"):
            yield info.name
