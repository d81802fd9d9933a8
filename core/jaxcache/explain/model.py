"""What an explanation is made from: the miss, what records and the cache say about keys, and the answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import Fingerprint


@dataclass(frozen=True, slots=True)
class Known:
    """One record's word on one key: who looked it up, what happened, and what entered it."""

    key: str
    function: str
    event: str  # "write", "compiled" (compiled, not written: ``reason`` says why) or "hit"
    at: float
    job: str | None = None
    run_id: str | None = None
    process_index: int = 0
    kind: str = "job"  # "job", "warmup", "warmup-verify"
    parts: KeyParts | None = None
    program: ProgramSignature | None = None
    fingerprint: Fingerprint | None = None
    topology: str | None = None
    reason: str | None = None
    compile_s: float | None = None


#: A miss is what a process's record says about a key it compiled (``event`` "write" or "compiled").
Miss = Known


@dataclass(frozen=True, slots=True)
class EntryNow:
    """A key's entry as the cache holds it now. ``readable``: None when nobody checked."""

    key: str
    created_s: float
    readable: bool | None = None
    compression: str | None = None  # "zstandard" or "zlib", as JAX names the library, from the entry's magic
    problem: str | None = None  # why it is not readable


@dataclass(frozen=True, slots=True)
class Deletion:
    """A deletion the catalog audited (a prune or a DELETE)."""

    key: str
    at_s: float
    by: str  # who asked
    how: str  # "prune #12 (unused_for 14d)" or "DELETE"


class History(Protocol):
    """What an explainer may ask: the CLI answers from a root's records, the service from its catalog."""

    def entry(self, key: str) -> EntryNow | None: ...

    def deletion(self, key: str, *, before: float) -> Deletion | None: ...

    def earlier(self, key: str, *, before: float) -> list[Known]: ...

    def of_function(self, function: str) -> list[Known]: ...

    def entries_of_function(self, function: str) -> list[EntryNow]: ...


@dataclass(frozen=True, slots=True)
class PartDiff:
    """One part that differs from the nearest key's, with both readable values where there are any."""

    part: str
    mine: str | None = None
    theirs: str | None = None
    changes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"part": self.part, "mine": self.mine, "theirs": self.theirs, "changes": list(self.changes)}


@dataclass(frozen=True, slots=True)
class Explanation:
    """One miss's cause (see :data:`jaxcache.explain.causes.CAUSES`), what differs, the key compared, the fix."""

    cause: str
    fix: str
    differs: tuple[PartDiff, ...] = ()
    nearest: str | None = None
    detail: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {"cause": self.cause, "differs": [d.as_dict() for d in self.differs], "nearest": self.nearest,
                "fix": self.fix}
