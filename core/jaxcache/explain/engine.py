"""Deciding a miss's cause, in the order of :data:`jaxcache.explain.causes.CAUSES`: what happened to the key itself
(deleted, unreadable, never written), then what the nearest key of the same function differs in."""

from __future__ import annotations

from jaxcache import keyparts as kp
from jaxcache import skips, unreadable
from jaxcache.explain import causes as c
from jaxcache.explain.model import EntryNow, Explanation, History, Known, Miss, PartDiff
from jaxcache.explain.values import diff
from jaxcache.keyparts import KeyParts

# The processes of one run compile the same programs at about the same time, each missing them: what the miss's own
# run says is no evidence about the cache it found. Only other runs' words count.
_EARLIER_EVENTS = ("write", "hit")


def explain(miss: Miss, history: History, *, root: str = "ROOT") -> Explanation:
    """The cause of one miss (a key a process compiled because the cache did not give it one)."""
    others = [k for k in history.earlier(miss.key, before=miss.at) if k.run_id != miss.run_id]
    found = _about_the_key(miss, history, others, root)
    if found is not None:
        return found
    # What the cache could have given at the time: keys recorded, and entries written, before the miss. Other keys
    # of the function that the miss's own run wrote earlier count: one run compiles a function at several shapes.
    # An entry's time is the store's mtime (whole seconds on S3 and Azure, cut down), the miss's the process's clock:
    # what this very run wrote after its miss can read as older than it. Its record says when it wrote each key, so
    # those entries are left out by the record, not by their mtime; an entry no record names (plain JAX's) counts by
    # its mtime, however shortly before the miss it was written.
    of_function = history.of_function(miss.function)
    family = [k for k in of_function if k.key != miss.key and k.at < miss.at]
    later = {k.key for k in of_function if k.run_id == miss.run_id and k.event == "write" and k.at >= miss.at}
    entries = [e for e in history.entries_of_function(miss.function)
               if e.key != miss.key and e.key not in later and e.created_s < miss.at]
    if not family and not entries:
        return Explanation(c.NEW_PROGRAM, c.fix(c.NEW_PROGRAM, function=miss.function))
    mine = miss.parts
    with_parts = [(k, k.parts) for k in family if k.parts is not None and k.event in ("write", "hit")]
    if mine is None or not with_parts:
        return _without_parts(miss, entries, family)
    # Many records name the same key: compare each distinct set of parts once, by its latest record.
    latest: dict[KeyParts, Known] = {}
    for k, p in with_parts:
        if p not in latest or k.at > latest[p].at:
            latest[p] = k
    theirs, nearest = min(latest.items(), key=lambda item: (len(mine.differing(item[0])), -item[1].at, item[1].key))
    differing = mine.differing(theirs)
    if not differing:
        return Explanation(c.UNKNOWN, c.fix(c.UNKNOWN, why="the recorded parts are equal, yet the keys differ"),
                           nearest=nearest.key)
    differs = tuple(diff(p, miss, nearest) for p in differing)
    if differing == [kp.COMPUTATION]:
        runs = _unstable_runs(miss, [k for k in family if k.run_id != miss.run_id])
        if runs >= 2:
            return Explanation(c.UNSTABLE_PROGRAM, c.fix(c.UNSTABLE_PROGRAM, function=miss.function, runs=runs),
                               differs, nearest.key)
        changes = "; ".join(differs[0].changes) or "the program body changed"
        types_only = (miss.program is not None and nearest.program is not None
                      and miss.program.only_types_changed(nearest.program))
        text = c.fix(c.PROGRAM_CHANGED, function=miss.function, changes=changes, types_only=types_only)
        return Explanation(c.PROGRAM_CHANGED, text, differs, nearest.key)
    # A change of environment (jaxlib, flags, devices) usually changes the lowered program too: it is the cause.
    # XLA reads flags and the device count into the compile options, so those differ along with either: the
    # options are the cause only when nothing else is.
    environment = [p for p in differing if p != kp.COMPUTATION]
    cause = next((p for p in environment if p != kp.COMPILE_OPTIONS), environment[0])
    first = next(d for d in differs if d.part == cause)
    text = c.fix(cause, mine=first.mine or "?", theirs=first.theirs or "?",
                 changes="; ".join(first.changes) or "values not recorded")
    return Explanation(cause, text, differs, nearest.key)


def _about_the_key(miss: Miss, history: History, others: list[Known], root: str) -> Explanation | None:
    """skipped, evicted, unreadable or not_written: what happened to this very key before the miss."""
    why = skips.why_skipped(miss.reason)
    if why is not None:  # the miss's own word: the entry was there and this job refused it (verify=)
        removal = skips.removal(root, {miss.key: why})
        return Explanation(c.SKIPPED, c.fix(c.SKIPPED, why=why, removal=removal), detail={"reason": why})
    deletion = history.deletion(miss.key, before=miss.at)
    if deletion is not None:
        how = f"by {deletion.how} ({deletion.by}) at {_when(deletion.at_s)}"
        return Explanation(c.EVICTED, c.fix(c.EVICTED, how=how, function=miss.function),
                           detail={"deleted_at": _when(deletion.at_s), "by": deletion.by, "how": deletion.how})
    entry = history.entry(miss.key)
    # The miss's own word first (its put found the entry there), else the entry's age: the client's summary decides
    # "unreadable" by the same two (jaxcache.unreadable), so both name one cause.
    present_then = unreadable.said(miss.reason) or (
        entry is not None and unreadable.there_before(entry.created_s, miss.at))
    if present_then:
        fix = c.fix(c.UNREADABLE, problem=_problem(entry, miss.at), root=root, key=miss.key)
        return Explanation(c.UNREADABLE, fix)
    stored = [k for k in others if k.event in _EARLIER_EVENTS]
    if stored:
        when = _when(max(k.at for k in stored))
        how = (f"after {when} (it was in the cache then); by whom is not recorded here: the service's prune audit "
               "log names prunes and deletes")
        return Explanation(c.EVICTED, c.fix(c.EVICTED, how=how, function=miss.function))
    unwritten = [k for k in others if k.event == "compiled"]
    if unwritten:
        last = max(unwritten, key=lambda k: k.at)
        return Explanation(c.NOT_WRITTEN, c.fix(c.NOT_WRITTEN, reason=last.reason),
                           detail={"reason": last.reason or "", "run_id": last.run_id or ""})
    return None


def _problem(entry: EntryNow | None, at: float) -> str:
    """What is wrong with an entry a miss found there and JAX could not load, as far as it can be told now."""
    if entry is None:
        return "it has been removed since"
    if entry.readable is False:
        return entry.problem or "unreadable"
    if entry.readable is None:
        return entry.problem or "it could not be checked"
    if not unreadable.there_before(entry.created_s, at):
        return ("it reads fine now and was written about when the job looked it up: another process was writing it"
                " then")
    return "it reads fine now: the job could not read it at the time (a storage error?)"


def _without_parts(miss: Miss, entries: list[EntryNow], family: list[Known]) -> Explanation:
    """No key of the function carries parts: what the entries themselves reveal (their compression), else
    unknown."""
    mine = miss.fingerprint.compression if miss.fingerprint else None
    other = next((e.compression for e in entries if e.compression and mine and e.compression != mine), None)
    if other is not None and mine is not None:
        text = c.fix(kp.COMPRESSION, mine=mine, theirs=other)
        return Explanation(kp.COMPRESSION, text, (PartDiff(kp.COMPRESSION, mine, other),), entries[0].key)
    why = ("the entries of this function were written by plain JAX (no run record)" if entries and not family
           else "the records of this function carry no key parts: written before jaxcache recorded them")
    return Explanation(c.UNKNOWN, c.fix(c.UNKNOWN, why=why), nearest=entries[0].key if entries else None)


def _unstable_runs(miss: Miss, family: list[Known]) -> int:
    """How many runs of the miss's job compiled this function with the same signature and environment, each
    to another program (0 unless each run's program differed)."""
    if miss.parts is None:
        return 0
    rest = {p: getattr(miss.parts, p) for p in kp.ORDER if p != kp.COMPUTATION}
    same = [k for k in family if k.job == miss.job and k.parts is not None and k.event in ("write", "compiled")
            and k.program == miss.program and all(getattr(k.parts, p) == v for p, v in rest.items())]
    by_run: dict[str | None, set[str | None]] = {}
    for k in [*same, miss]:
        by_run.setdefault(k.run_id, set()).add(k.parts.computation if k.parts else None)
    programs = {p for ps in by_run.values() for p in ps}
    return len(by_run) if len(by_run) >= 2 and len(programs) == len(by_run) else 0


def _when(at_s: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(at_s, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")

