"""The vocabulary of miss causes, in the order they are decided, and the one line of advice each gets."""

from __future__ import annotations

from typing import Final

from jaxcache import keyparts as kp
from jaxcache import unreadable

SKIPPED: Final = "skipped"
EVICTED: Final = "evicted"
UNREADABLE: Final = "unreadable"
NOT_WRITTEN: Final = "not_written"
NEW_PROGRAM: Final = "new_program"
UNSTABLE_PROGRAM: Final = "unstable_program"
PROGRAM_CHANGED: Final = "program_changed"
UNKNOWN: Final = "unknown"
#: The causes named after a key part (the nearest entry has the same program and differs there).
PART_CAUSES: tuple[str, ...] = kp.ORDER[1:]
CAUSES: tuple[str, ...] = (SKIPPED, EVICTED, UNREADABLE, NOT_WRITTEN, NEW_PROGRAM, UNSTABLE_PROGRAM, PROGRAM_CHANGED,
                           *PART_CAUSES, UNKNOWN)

_FIX = {
    SKIPPED: "the job's verify mode refused the entry ({why}) and compiled it; JAX never overwrites an entry, so "
             "every verifying job skips it until it is removed: {removal}",
    EVICTED: "it was deleted {how}; this run wrote it again. If it is still used, pin it (PUT "
             "/v1/caches/CACHE/pins/{function}*) or loosen the prune policy",
    NEW_PROGRAM: "the first time this cache sees {function}: warm it up (`warmup --entrypoint ...` with the job's "
                 "topology) or let one run write it",
    UNSTABLE_PROGRAM: "the same job compiled {function} with the same signature and environment in {runs} runs and "
                      "its program differed every time: something non-deterministic enters the lowering "
                      "(custom_partitioning's callback pointers: wrap that primitive in shard_map; or a value "
                      "captured at trace time, such as a time or a seed: pass it as an argument). If you edited "
                      "the function between these runs, that edit is the change",
    PROGRAM_CHANGED: "{function} is not the program the cache has: {changes}",
    kp.JAXLIB: "the entry was written with jaxlib {theirs}, this job runs {mine}: rerun the warm-up with the job's "
               "image",
    kp.BACKEND: "the entry was written on backend {theirs}, this job runs on {mine} (driver or runtime version): "
                "warm up on machines with the job's driver and runtime",
    kp.XLA_FLAGS: "XLA flags differ ({changes}): give the warm-up the job's XLA_FLAGS",
    kp.COMPILE_OPTIONS: "the compile options differ ({changes}): compile with the same options as the job (jax.jit's "
                        "compiler_options, donated arguments, the arguments' shardings, XLA flags)",
    kp.DEVICES: "the devices differ ({theirs} → {mine}): warm up for the job's topology (`warmup --topology ...`)",
    kp.COMPRESSION: "the entry was written by a process that hashes {theirs}, this job hashes {mine}: install "
                    "zstandard everywhere, and run writers and readers on the same Python",
    kp.CUSTOM_HOOK: "the compilation cache's custom key hook returns something else in this job than in the "
                    "writer: make it return the same value",
    UNKNOWN: "nothing recorded tells why ({why}): let writers and readers enable the cache through "
             "jaxcache.client (its run records carry each key's parts)",
}

_NOT_WRITTEN = (
    ("under jax_persistent_cache_min_compile_time_secs", "an earlier run compiled it in less time than "
     "jax_persistent_cache_min_compile_time_secs and JAX did not store it ({reason}): lower the threshold "
     "(enable_cache(min_compile_time_secs=0))"),
    ("under jax_persistent_cache_min_entry_size_bytes", "an earlier run did not store it: {reason}; lower "
     "min_entry_size_bytes (enable_cache(min_entry_size_bytes=-1))"),
    ("host callbacks", "JAX does not cache programs that use host callbacks (jax.debug.print, pure_callback): "
     "keep them out of hot functions"),
    ("only process 0", "only process 0 writes the cache, and process 0 of the earlier run did not compile it: warm "
     "the cache up, or let process 0 compile every program"),
    ("disabled", "the persistent cache was disabled in the run that compiled it: enable it there"),
)


def fix(cause: str, **facts: object) -> str:
    """The advice for ``cause``, its blanks filled from ``facts``."""
    if cause == UNREADABLE:  # the client's summary gives the same advice (jaxcache.unreadable)
        return unreadable.fix(str(facts.get("root") or "ROOT"), [str(facts.get("key") or "KEY")],
                              str(facts.get("problem") or "") or None)
    if cause == NOT_WRITTEN:
        reason = str(facts.get("reason") or "")
        for marker, text in _NOT_WRITTEN:
            if marker in reason:
                return text.format(reason=reason)
        return f"an earlier run compiled it and JAX did not store it ({reason or 'no reason recorded'})"
    text = _FIX[cause].format_map(_Blank(facts))
    if cause == kp.COMPILE_OPTIONS and "allow_spmd_sharding_propagation_to_parameters" in str(facts.get("changes")):
        text += (". That option follows the arguments' placement: place each as the job does (a NamedSharding over "
                 "its mesh); an uncommitted one, such as a Python scalar, lets XLA choose")
    if cause == PROGRAM_CHANGED and facts.get("types_only"):
        text += (". Only shapes or dtypes changed: bucket or pad inputs to a few shapes, or warm up each shape the "
                 "job uses (`warmup --entrypoint ...`)")
    return text


class _Blank(dict[str, object]):
    def __missing__(self, name: str) -> str:
        return "?"
