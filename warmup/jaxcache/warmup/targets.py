"""The targets of one ``warmup`` command: ``--topology`` repeated, or a file that lists them (``--targets``), one
picked by ``--index`` (a Kubernetes Indexed Job's completion index), each in its one spelling."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Sequence

from jaxcache.display import excerpt, shown
from jaxcache.errors import InvalidInputError
from jaxcache.storage.named import read_named
from jaxcache.topology import is_tpu_name, parse_any_topology

# Options the command that runs many targets keeps to itself; a target's process gets the rest as given.
LIST_OPTIONS = frozenset({"topology", "targets", "index", "parallel", "json", "help", "check_on", "verify_child",
                          "checked_flags"})
# Options only a TPU target's process takes (a GPU or CPU target's process refuses them).
TPU_OPTIONS = frozenset({"libtpu_init_args", "target_xla_flags", "flags_from_job", "chips_per_host", "num_slices"})
# The options that give a TPU target's flags: a target's process handed the flags the command checked takes none.
FLAG_OPTIONS = frozenset({"libtpu_init_args", "target_xla_flags", "flags_from_job"})
MAX_TARGETS = 256  # a list longer than this is a mistake, not a release's shapes
MAX_FILE_BYTES = 1 << 20  # 256 targets with comments take a few KiB


def read_file(path: str) -> list[str]:
    """The targets a file lists: one a line; blank lines and text after ``#`` are left out. The file is judged and
    read as every file a user names is (jaxcache.storage.named: no link of another user's, no FIFO or device, at most
    :data:`MAX_FILE_BYTES`)."""
    said = f"--targets {shown(path)}"
    try:
        lines = read_named(path, "--targets", MAX_FILE_BYTES).decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise InvalidInputError(f"{said}: not UTF-8 text; list the targets one a line") from None
    out = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if len(text.split()) != 1:
            raise InvalidInputError(f"{said}, line {number}: {excerpt(text)}: one target a line, e.g. v5e:4x8,"
                                    " 2xv5e:16x16 or 4x8x1")
        out.append(text)
    if not out:
        raise InvalidInputError(f"{said} lists no target: write one a line, e.g. v5e:4x8")
    return out


def from_args(topologies: Sequence[str] | None, targets_file: str | None, index: int | None) -> list[str]:
    """The command's targets as given; ``index`` keeps the one at that place (from 0). A list of several is checked
    whole, each spelled one way. Raises :class:`InvalidInputError` for a malformed target in a list, a duplicate, or
    an index past the list."""
    texts = [t.strip() for t in (*(topologies or ()), *(read_file(targets_file) if targets_file else ()))]
    if not texts:
        raise InvalidInputError("give the target: --topology (repeat it for several) or --targets FILE")
    if len(texts) > MAX_TARGETS:
        raise InvalidInputError(f"{len(texts)} targets is more than {MAX_TARGETS}; is the list what you meant?")
    if len(texts) > 1:
        seen: set[str] = set()
        for text in texts:
            spelling = str(parse_any_topology(text))
            if spelling in seen:
                raise InvalidInputError(f"target {spelling} is listed twice")
            seen.add(spelling)
    if index is None:
        return texts
    if index >= len(texts):
        raise InvalidInputError(f"--index {index}: the list has {len(texts)} target(s), indexed 0 to {len(texts) - 1};"
                                " an Indexed Job's completions must equal the targets listed")
    return [texts[index]]


def for_target(args: argparse.Namespace, text: str) -> argparse.Namespace:
    """This command's options for one of its targets. In a list, a slice name is a TPU target whatever --platform
    says (it names the platform of the SxHxD targets); the TPU options go to TPU targets only."""
    one = copy.copy(args)
    one.topology = text
    if is_tpu_name(text):
        one.platform = "tpu"
    else:
        for name in TPU_OPTIONS:
            setattr(one, name, None)
    return one


def child_argv(parser: argparse.ArgumentParser, one: argparse.Namespace, *, platform: str,
               script_args: Sequence[str], check_on: str | None = None,
               checked_flags: str | None = None) -> list[str]:
    """The arguments of one target's own ``warmup`` process (``one`` from :func:`for_target`): the options given,
    its platform made explicit, its summary as JSON. ``checked_flags``: a TPU target's flags as the command resolved
    and checked them (``TargetFlags.to_json``), given in place of the options they came from."""
    argv = [f"--topology={one.topology}", f"--platform={platform}", "--json"]
    for action in parser._actions:
        name = action.dest
        if (not action.option_strings or name in LIST_OPTIONS or name == "platform"
                or (checked_flags is not None and name in FLAG_OPTIONS)):
            continue
        value = getattr(one, name, None)
        if value is None or value == action.default:
            continue
        option = max(action.option_strings, key=len)
        argv.append(option if action.nargs == 0 else f"{option}={value}")
    if check_on is not None:
        argv.append(f"--check-on={check_on}")
    if checked_flags is not None:
        argv.append(f"--checked-flags={checked_flags}")
    return [*argv, "--", *script_args] if script_args else argv
