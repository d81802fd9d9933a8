"""The user's code a warm-up runs: an entrypoint ``pkg.module:function`` or a script run as ``__main__``.

Failures inside it are the user's, not warm-up's: they are reported with their traceback under a banner that
says so, and exit 1.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxcache.errors import InvalidInputError, JaxcacheError
from jaxcache.storage.named import check_named


class UserCodeError(JaxcacheError):
    """The entrypoint or script raised; ``details`` holds its traceback."""

    def __init__(self, message: str, details: str) -> None:
        super().__init__(message)
        self.details = details


@dataclass(frozen=True)
class Target:
    """What to run: exactly one of ``entrypoint`` or ``script``."""

    entrypoint: str | None = None
    script: str | None = None
    script_args: Sequence[str] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """How messages name it."""
        return self.entrypoint or f"{self.script} {' '.join(self.script_args)}".strip()


def make_target(entrypoint: str | None, script: str | None, script_args: Sequence[str]) -> Target:
    """Check ``--entrypoint``/``--script`` (exactly one, well formed, there) without importing anything: the
    entrypoint's top-level package must be found here."""
    if bool(entrypoint) == bool(script):
        raise InvalidInputError(
            "give exactly one of --entrypoint pkg.module:function or --script path.py"
            + (" (not both)" if entrypoint else "")
        )
    if script_args and not script:
        raise InvalidInputError("arguments after -- are for --script; an --entrypoint takes none")
    if entrypoint:
        module, sep, name = entrypoint.partition(":")
        if not sep or not module or not name.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
            raise InvalidInputError(f"--entrypoint {entrypoint!r}: write it as pkg.module:function")
        top = module.partition(".")[0]
        if not _findable(top):
            raise InvalidInputError(f"--entrypoint {entrypoint!r}: no module {top!r} here; run from the directory"
                                    " that holds it, or install its package")
        return Target(entrypoint=entrypoint)
    assert script is not None
    check_named(script, "--script")  # the warm-up runs it: never through a link another user could re-point
    if not os.path.isfile(script):
        raise InvalidInputError(f"--script {script!r}: no such file")
    return Target(script=script, script_args=tuple(script_args))


def load(target: Target) -> Callable[[Any], Any] | None:
    """Import the entrypoint's function (``None`` for a script). Import failures are the user's: exit 1."""
    if target.entrypoint is None:
        return None
    module_name, _, name = target.entrypoint.partition(":")
    _path_with_cwd()
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - any failure while importing user code is theirs
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserCodeError(f"the entrypoint module {module_name!r} failed to import", _user_traceback()) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise InvalidInputError(f"--entrypoint {target.entrypoint!r}: {module_name} has no function {name!r}")
    return function


def _path_with_cwd() -> None:
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `warmup --entrypoint mypkg.jobs:warm` run from the project directory


def _findable(top: str) -> bool:
    """Whether a top-level module can be imported here, found as the import would find it and imported not (only a
    dotted name's parents are imported to find it)."""
    if top in sys.modules:
        return True
    _path_with_cwd()
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return True  # found, though not as expected: the import says what is wrong, as the user's failure


def run(target: Target, function: Callable[[Any], Any] | None, context: Any) -> None:
    """Run the entrypoint with ``context``, or the script as ``__main__`` with its arguments."""
    try:
        if function is not None:
            function(context)
            return
        assert target.script is not None
        saved_argv = sys.argv
        sys.argv = [target.script, *target.script_args]
        try:
            runpy.run_path(target.script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise
        finally:
            sys.argv = saved_argv
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise UserCodeError(f"{target.label} raised {type(exc).__name__}: {exc}", _user_traceback()) from None


def _user_traceback() -> str:
    """The current exception's traceback, without warm-up's, importlib's and runpy's frames."""
    exc_type, exc, tb = sys.exc_info()
    here = os.path.abspath(__file__)
    frames = [
        f for f in traceback.extract_tb(tb)
        if os.path.abspath(f.filename) != here and "importlib" not in f.filename
        and not f.filename.endswith("runpy.py")
    ]
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
    return text + "".join(traceback.format_exception_only(exc_type, exc)).rstrip()
