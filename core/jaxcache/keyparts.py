"""What enters a JAX cache key, part by part: the hash JAX gives each part (in the order it hashes them) and the
readable facts behind them, as run and coverage records carry them. Two keys of one program compare here: the
parts that differ say why a job missed (:mod:`jaxcache.explain`)."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

#: The parts of a key in the order JAX hashes them, by the names jaxcache uses (also the names of miss causes).
COMPUTATION: Final = "computation"
JAXLIB: Final = "jaxlib"
BACKEND: Final = "backend"
XLA_FLAGS: Final = "xla_flags"
COMPILE_OPTIONS: Final = "compile_options"
DEVICES: Final = "devices"
COMPRESSION: Final = "compression"
CUSTOM_HOOK: Final = "custom_hook"
ORDER: tuple[str, ...] = (COMPUTATION, JAXLIB, BACKEND, XLA_FLAGS, COMPILE_OPTIONS, DEVICES, COMPRESSION, CUSTOM_HOOK)

# A SHA-256 hex digest by its length only: a pattern costs a regular-expression match per value, and a record
# carries eight per key (a hash that is not hex is no danger to anyone: it just matches nothing).
Hash = Annotated[str, msgspec.Meta(min_length=64, max_length=64)]
# One argument or result as the program's main function declares it: "f32[32,128]", with its sharding if any
# (bounded by length only, like Hash: records carry a few per key, and the catalog keeps them as JSON).
Operand = Annotated[str, msgspec.Meta(max_length=1000)]
Operands = Annotated[tuple[Operand, ...], msgspec.Meta(max_length=4096)]
#: The compile options behind the ``compile_options`` hash, bounded: at most MAX_OPTIONS fields, each a name and
#: its value as short text (a longer value keeps its start and a digest of the whole, so two still compare).
#: Bounded by length only, like Hash and Operand: a pattern costs a match per value, and a key carries a dozen.
MAX_OPTIONS, MAX_OPTION_TEXT = 64, 120
OptionText = Annotated[str, msgspec.Meta(max_length=MAX_OPTION_TEXT)]
OptionFields = Annotated[tuple[tuple[OptionText, OptionText], ...], msgspec.Meta(max_length=MAX_OPTIONS)]
#: What an option not listed has: the value XLA gives it when nothing sets it (options are listed where they differ).
DEFAULT = "(default)"
#: The name of the last field where more options differed than a key keeps: an option not listed is then unknown.
MORE = "(more)"


class KeyParts(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):  # no cycles: see records.KeyUsage
    """The SHA-256 JAX computed of each part of one key (a part JAX did not report is None)."""

    computation: Hash | None = None
    jaxlib: Hash | None = None
    backend: Hash | None = None
    xla_flags: Hash | None = None
    compile_options: Hash | None = None
    devices: Hash | None = None
    compression: Hash | None = None
    custom_hook: Hash | None = None
    #: The compile options JAX hashed that differ from XLA's defaults or are set by a flag, as (name, value) pairs
    #: sorted by name (None: not captured; records from before it have none).
    options: OptionFields | None = None

    def option_changes(self, before: KeyParts) -> list[str]:
        """The compile options that changed from ``before``, in words: "use_spmd_partitioning: True → False" (an
        option one side does not list has its default there); empty where either side recorded none."""
        if self.options is None or before.options is None:
            return []
        mine, theirs = dict(self.options), dict(before.options)
        names = sorted((mine.keys() | theirs.keys()) - {MORE})
        return [f"{name}: {theirs.get(name, _absent(theirs))} → {mine.get(name, _absent(mine))}"
                for name in names if mine.get(name) != theirs.get(name)]

    def differing(self, other: KeyParts) -> list[str]:
        """The parts, in JAX's order, that both know and that differ."""
        return [p for p in ORDER if (a := getattr(self, p)) is not None and (b := getattr(other, p)) is not None
                and a != b]

    def known(self) -> list[str]:
        return [p for p in ORDER if getattr(self, p) is not None]


def _absent(options: dict[str, str]) -> str:
    return "(not recorded)" if MORE in options else DEFAULT


class ProgramSignature(msgspec.Struct, frozen=True, gc=False):
    """The entry signature of a program (its module's ``main``): what "the program changed" can point at."""

    args: Operands = ()
    results: Operands = ()

    def only_types_changed(self, before: ProgramSignature) -> bool:
        """Whether only shapes or dtypes changed from ``before``: as many arguments and results, and every one that
        differs keeps its sharding, memory kind and donation (what follows the type in its text)."""
        pairs = list(zip(before.args, self.args, strict=False)) + list(zip(before.results, self.results, strict=False))
        changed = [(a, b) for a, b in pairs if a != b]
        return (len(before.args) == len(self.args) and len(before.results) == len(self.results) and bool(changed)
                and all(a.partition(" ")[2] == b.partition(" ")[2] for a, b in changed))

    def changes(self, before: ProgramSignature) -> list[str]:
        """What changed from ``before``, in words: "argument 0: f32[32,128] → f32[16,128]"."""
        out = []
        for what, old, new in (("argument", before.args, self.args), ("result", before.results, self.results)):
            if len(old) != len(new):
                out.append(f"{len(old)} → {len(new)} {what}s")
            for i, (a, b) in enumerate(zip(old, new, strict=False)):
                if a != b:
                    out.append(f"{what} {i}: {a} → {b}")
        return out
