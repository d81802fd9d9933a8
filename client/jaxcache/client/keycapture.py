"""What went into each cache key: the hash of each part as JAX logs it, the XLA flags it hashed, and the program's
entry signature, collected per thread and handed to the lookup that names the key next (docs/jax-internals.md,
"Key parts"). JAX logs the parts only while it computes a key, so nothing here runs per training step.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from jaxcache.client import jax_internals as ji
from jaxcache.keyparts import COMPUTATION, XLA_FLAGS, KeyParts, OptionFields, ProgramSignature


class _Key:
    """One key being hashed on one thread: its parts so far, the flags logged, and the hash of all so far."""

    __slots__ = ("flags", "parts", "so_far", "xla_flags")

    def __init__(self) -> None:
        self.parts: dict[str, str] = {}
        self.flags: list[str] = []
        self.xla_flags: tuple[str, ...] | None = None
        self.so_far = ""


class KeyCapture:
    """Reads ``jax._src.cache_key``'s records (through the Recorder's tap) and the key hook's signatures."""

    def __init__(self) -> None:
        self._local = threading.local()
        #: The flags JAX hashed into the last key it computed in this process (the fingerprint's ``xla_flags``).
        self.xla_flags: tuple[str, ...] | None = None

    def on_log(self, record: logging.LogRecord) -> None:
        """One record of JAX's key logger; called on the compiling thread, never raises into it."""
        msg = record.msg if isinstance(record.msg, str) else ""
        args: tuple[Any, ...] = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith(ji.FLAG_MSG.prefix) and len(args) == 1:
            self._current().flags.append(str(args[0]))
        elif msg.startswith(ji.PART_MSG.prefix) and len(args) == 2:
            label, digest = str(args[0]), str(args[1])
            name = ji.PART_LABELS.get(label)
            if name == COMPUTATION:  # the first part: a new key starts on this thread
                self._finish()
                self._local.key = _Key()
            key = self._current()
            if name is None:
                ji.less_detail(f"hashes a part jaxcache does not know into its cache keys ({label!r}): run records"
                               " cannot say whether that part changed")
                return
            key.parts[name] = digest
            if name == XLA_FLAGS:
                key.xla_flags = _once(key.flags)
                self.xla_flags = key.xla_flags
        elif msg.startswith(ji.SO_FAR_MSG.prefix) and len(args) == 2:
            self._current().so_far = str(args[1])

    def on_key(self, key: str, program: ProgramSignature | None, options_of: ji.OptionsOf | None = None) -> None:
        """The key hook: JAX computed ``key`` for a program with this signature, on this thread; ``options_of``
        reads its compile options (given the flags JAX hashed into it, which it logged just before)."""
        programs: dict[str, ProgramSignature | None] = self._pending("programs")
        programs[key] = program
        if options_of is not None:
            current: _Key | None = getattr(self._local, "key", None)
            flags = current.xla_flags if current is not None and current.xla_flags is not None else ()
            options: dict[str, OptionFields | None] = self._pending("options")
            options[key] = options_of(flags)

    def take(self, key: str) -> tuple[KeyParts | None, ProgramSignature | None]:
        """The parts and signature captured for ``key`` on this thread, at the record that names it; what is left
        over (keys JAX computed but did not look up) is dropped, so nothing accumulates."""
        self._finish()
        done: dict[str, dict[str, str]] = self._pending("done")
        programs: dict[str, ProgramSignature | None] = self._pending("programs")
        options: dict[str, OptionFields | None] = self._pending("options")
        parts = done.get(key.rsplit("-", 1)[-1])
        program, fields = programs.get(key), options.get(key)
        done.clear()
        programs.clear()
        options.clear()
        return (KeyParts(**parts, options=fields) if parts else None), program

    def _current(self) -> _Key:
        key: _Key | None = getattr(self._local, "key", None)
        if key is None:
            key = self._local.key = _Key()
        return key

    def _finish(self) -> None:
        # The hash of all parts is the key's own hash: it is what ties the parts to the key the lookup names.
        key: _Key | None = getattr(self._local, "key", None)
        if key is not None and key.so_far and key.parts:
            self._pending("done")[key.so_far] = key.parts
        self._local.key = None

    def _pending(self, name: str) -> Any:
        found = getattr(self._local, name, None)
        if found is None:
            found = {}
            setattr(self._local, name, found)
        return found


def _once(flags: list[str]) -> tuple[str, ...]:
    """The flags of one key. With its log at DEBUG JAX hashes each part twice, so the sorted list comes twice in a
    row; a flag given twice comes twice within each pass, which this keeps."""
    half = len(flags) // 2
    if len(flags) % 2 == 0 and flags[:half] == flags[half:]:
        return tuple(flags[:half])
    return tuple(flags)
