"""The miss explainer on hand-made histories: one test per cause, the order causes are decided in, and the CLI
over records written to a real root. (Real JAX makes each cause happen in test_explain_jax.py.)"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace

import msgspec
import pytest

from jaxcache import keyparts as kp
from jaxcache import skips, unreadable
from jaxcache.cli import main as cli_main
from jaxcache.explain import Deletion, EntryNow, Known, explain
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.records import Fingerprint

NOW = 1_800_000_000.0
FP = Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", device_kind="cpu", device_count=2, process_count=1,
                 compression="zstandard", platform_version="cpu 1", xla_flags=("--xla_cpu_fast=true",))


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parts(**changed: str) -> KeyParts:
    return KeyParts(**{p: h(changed.get(p, p)) for p in kp.ORDER})


def key(function: str, salt: str) -> str:
    return f"{function}-{h(salt)}"


SIG = ProgramSignature(args=("f32[32,128]",), results=("f32[32,128]",))


def known(k: str, event: str, at: float, *, job: str = "train", run: str = "r1", p: KeyParts | None = None,
          fp: Fingerprint = FP, program: ProgramSignature | None = SIG, reason: str | None = None,
          kind: str = "job") -> Known:
    return Known(key=k, function=k.rsplit("-", 1)[0], event=event, at=at, job=job, run_id=run, kind=kind,
                 parts=p if p is not None else parts(), program=program, fingerprint=fp, reason=reason)


@dataclass
class FakeHistory:
    knowns: list[Known] = field(default_factory=list)
    entries: dict[str, EntryNow] = field(default_factory=dict)
    deletions: dict[str, Deletion] = field(default_factory=dict)

    def entry(self, k):
        return self.entries.get(k)

    def deletion(self, k, *, before):
        d = self.deletions.get(k)
        return d if d is not None and d.at_s < before else None

    def earlier(self, k, *, before):
        return [x for x in self.knowns if x.key == k and x.at < before]

    def of_function(self, f):
        return [x for x in self.knowns if x.function == f]

    def entries_of_function(self, f):
        return [e for e in self.entries.values() if e.key.rsplit("-", 1)[0] == f]


K = key("jit_step", "a")


def test_evicted_names_the_prune_that_deleted_it():
    hist = FakeHistory([known(K, "write", NOW - 100, run="r0")],
                       deletions={K: Deletion(K, NOW - 50, "token admin-1", "prune #7 (unused_for 14d)")})
    why = explain(known(K, "write", NOW, run="r2"), hist)
    assert why.cause == "evicted" and "prune #7" in why.fix and why.detail["by"] == "token admin-1"


def test_evicted_without_an_audit_log_when_an_earlier_run_had_it():
    hist = FakeHistory([known(K, "write", NOW - 100, run="r0")])
    assert explain(known(K, "write", NOW, run="r2"), hist).cause == "evicted"


def test_skipped_comes_first_with_why_and_the_command_that_removes_it():
    """The job's own record says it refused the entry (verify=): that is why it missed, though the entry reads."""
    hist = FakeHistory([known(K, "write", NOW - 100, run="r0")], entries={K: EntryNow(K, NOW - 100, readable=True)},
                       deletions={})
    why = explain(known(K, "compiled", NOW, run="r2", reason=skips.reason("tampered")), hist, root="/cache")
    assert why.cause == "skipped" and "(tampered)" in why.fix and why.detail == {"reason": "tampered"}
    assert "jaxcache prune /cache --integrity" in why.fix and f"rm -f /cache/{K}-cache /cache/{K}-sig" in why.fix
    unsigned = explain(known(K, "compiled", NOW, run="r2", reason=skips.reason("unsigned")), hist, root="/cache")
    assert unsigned.cause == "skipped" and "--integrity" not in unsigned.fix and f"/cache/{K}-cache" in unsigned.fix


def test_unreadable_names_the_command_that_removes_it():
    hist = FakeHistory(entries={K: EntryNow(K, NOW - 100, readable=False, problem="truncated")})
    why = explain(known(K, "compiled", NOW, run="r2"), hist, root="/cache")
    assert why.cause == "unreadable" and "(truncated)" in why.fix
    assert f"rm -f /cache/{K}-cache /cache/{K}-sig" in why.fix, "the command removes exactly this entry"


def test_an_entry_of_this_runs_own_write_in_a_whole_second_store_is_not_unreadable():
    """S3 and Azure give whole seconds: the entry this run wrote 0.1 s after its lookup at x.7 reads as x.0, 0.7 s
    before the lookup. That is no entry that was there before (as the client judges it, jaxcache.unreadable)."""
    at = NOW + 0.7
    hist = FakeHistory([known(K, "write", at, run="r2")], entries={K: EntryNow(K, float(int(at + 0.1)), readable=True)})
    why = explain(known(K, "write", at, run="r2"), hist)
    assert why.cause == "new_program", why


def test_the_misss_own_record_that_the_entry_was_there_is_unreadable_whatever_its_age():
    """The client's put hook found the entry there as JAX went to write: the miss met it, however recent its
    mtime, and even once it is removed."""
    miss = known(K, "compiled", NOW, run="r2", reason=unreadable.REASON)
    cases = {"(truncated)": EntryNow(K, NOW - 0.5, readable=False, problem="truncated"), "removed since": None,
             "another process was writing it": EntryNow(K, NOW + 0.3, readable=True)}
    for problem, entry in cases.items():
        why = explain(miss, FakeHistory(entries={K: entry} if entry else {}), root="/cache")
        assert why.cause == "unreadable" and problem in why.fix and f"rm -f /cache/{K}-cache" in why.fix, why


def test_not_written_says_why_and_what_to_set():
    reason = "compiled in 0.20 s, under jax_persistent_cache_min_compile_time_secs=1"
    hist = FakeHistory([known(K, "compiled", NOW - 100, run="r0", reason=reason)])
    why = explain(known(K, "compiled", NOW, run="r2"), hist)
    assert why.cause == "not_written" and "min_compile_time_secs=0" in why.fix and reason in why.fix


def test_new_program():
    assert explain(known(K, "write", NOW), FakeHistory()).cause == "new_program"


def test_program_changed_says_which_argument():
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0", p=parts(computation="v1"))],
                       {old: EntryNow(old, NOW - 100)})
    miss = known(K, "write", NOW, p=parts(computation="v2"),
                 program=ProgramSignature(args=("f32[16,128]",), results=("f32[16,128]",)))
    why = explain(miss, hist)
    assert why.cause == "program_changed" and why.nearest == old
    assert "argument 0: f32[32,128] → f32[16,128]" in why.differs[0].changes


def test_a_second_shape_in_the_same_run_is_a_changed_program_not_plain_jax():
    """One run compiles one function at two shapes: the entry it wrote first is its own, not plain JAX's."""
    first = key("jit_step", "32")
    hist = FakeHistory([known(first, "write", NOW - 5, run="r1", p=parts(computation="v32"))],
                       {first: EntryNow(first, NOW - 5)})
    miss = known(K, "write", NOW, run="r1", p=parts(computation="v16"),
                 program=ProgramSignature(args=("f32[16,128]",), results=("f32[16,128]",)))
    why = explain(miss, hist)
    assert why.cause == "program_changed" and why.nearest == first, why
    assert "argument 0: f32[32,128] → f32[16,128]" in why.differs[0].changes
    assert "plain JAX" not in why.fix and "bucket or pad" in why.fix and "warm up each shape" in why.fix


def test_a_changed_sharding_gets_no_advice_about_shapes():
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0", p=parts(computation="v1"))],
                       {old: EntryNow(old, NOW - 100)})
    sharded = ProgramSignature(args=("f32[32,128] sharding=<mesh<[\"x\"=4]>, [{\"x\"}, {}]>",),
                               results=("f32[32,128]",))
    why = explain(known(K, "write", NOW, p=parts(computation="v2"), program=sharded), hist)
    assert why.cause == "program_changed" and "bucket" not in why.fix, why


def test_same_signature_different_body_is_a_changed_program_once_and_unstable_across_runs():
    first = known(key("jit_step", "1"), "write", NOW - 200, run="r0", p=parts(computation="c1"))
    hist = FakeHistory([first])
    why = explain(known(K, "write", NOW, run="r1", p=parts(computation="c2")), hist)
    assert why.cause == "unstable_program" and "shard_map" in why.fix
    other_job = replace(first, job="eval")
    assert explain(known(K, "write", NOW, run="r1", p=parts(computation="c2")),
                   FakeHistory([other_job])).cause == "program_changed"


@pytest.mark.parametrize(("part", "fp_change"), [
    ("jaxlib", {"jaxlib": "0.12.0"}), ("backend", {"platform_version": "cuda 12.8"}),
    ("xla_flags", {"xla_flags": ("--xla_cpu_fast=false", "--xla_new=1")}), ("compile_options", {}),
    ("devices", {"device_count": 4}), ("compression", {"compression": "zlib"}), ("custom_hook", {}),
])
def test_a_part_that_differs_is_the_cause_with_both_values(part, fp_change):
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0")], {old: EntryNow(old, NOW - 100)})
    miss = known(K, "write", NOW, p=parts(**{part: "changed"}), fp=msgspec.structs.replace(FP, **fp_change))
    why = explain(miss, hist)
    assert why.cause == part and why.nearest == old and [d.part for d in why.differs] == [part]
    if part == "xla_flags":
        assert why.differs[0].changes == ("added --xla_new=1", "--xla_cpu_fast: true → false")
    if part == "jaxlib":
        assert (why.differs[0].theirs, why.differs[0].mine) == ("0.10.2", "0.12.0") and "0.10.2" in why.fix


def test_an_environment_change_outranks_the_program_change_it_brings():
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0")], {old: EntryNow(old, NOW - 100)})
    why = explain(known(K, "write", NOW, p=parts(computation="x", jaxlib="y")), hist)
    assert why.cause == "jaxlib" and [d.part for d in why.differs] == ["computation", "jaxlib"]


def test_plain_jax_entries_reveal_their_compression_else_unknown():
    old = key("jit_step", "old")
    zlib_entry = FakeHistory(entries={old: EntryNow(old, NOW - 100, compression="zlib")})
    assert explain(known(K, "write", NOW, p=None), zlib_entry).cause == "compression"
    same = FakeHistory(entries={old: EntryNow(old, NOW - 100, compression="zstandard")})
    why = explain(known(K, "write", NOW, p=None), same)
    assert why.cause == "unknown" and "plain JAX" in why.fix


def test_an_entry_is_there_before_a_miss_by_its_mtime_unless_the_misss_own_run_wrote_it_later():
    """S3 and Azure cut an entry's mtime to the whole second: what the miss's own run wrote after it may read as
    older than the miss. The run's record says it came later; an entry no record names counts by its mtime, however
    shortly before the miss it was written (plain JAX writing just before a job's start)."""
    other = key("jit_step", "other")
    plain = FakeHistory(entries={other: EntryNow(other, NOW - 0.5, compression="zlib")})
    assert explain(known(K, "write", NOW, p=None), plain).cause == "compression"
    own_later = FakeHistory([known(other, "write", NOW + 0.4, run="r1")],
                            entries={other: EntryNow(other, float(int(NOW)) - 0.0, compression="zlib")})
    assert explain(known(K, "write", NOW + 0.2, run="r1", p=None), own_later).cause == "new_program"


def test_the_order_is_evicted_first():
    hist = FakeHistory([known(K, "compiled", NOW - 90, run="r0", reason="only process 0 writes the cache"),
                        known(K, "write", NOW - 100, run="rw")],
                       deletions={K: Deletion(K, NOW - 50, "admin", "DELETE")})
    assert explain(known(K, "write", NOW, run="r2"), hist).cause == "evicted"


def test_the_cli_explains_a_roots_records(tmp_path, capsys):
    from jaxcache.records import KeyUsage, RunRecord

    root = tmp_path / "cache"
    root.mkdir()
    t = time.time()

    def write(run: str, usage: KeyUsage, fp: Fingerprint, at: float) -> None:
        record = RunRecord(job="train", run_id=run, process_index=0, process_count=1, host="h", started_at=at,
                           updated_at=at, fingerprint=fp, final=True, keys=[usage])
        path = root / record.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(record.to_json())

    old, new = key("jit_step", "old"), key("jit_step", "new")
    write("r0", KeyUsage(key=old, event="write", compiles=1, writes=1, first_at=t - 100, parts=parts(),
                         program=SIG), FP, t - 100)
    (root / f"{old}-cache").write_bytes(b"x")
    write("r1", KeyUsage(key=new, event="write", compiles=1, writes=1, first_at=t, compile_s=3.5,
                         parts=parts(xla_flags="other"), program=SIG), msgspec.structs.replace(FP, xla_flags=()), t)
    assert cli_main(["explain", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (miss,) = [m for m in out["misses"] if m["run_id"] == "r1"]
    assert miss["cause"] == "xla_flags" and miss["nearest"] == old and miss["compile_s"] == 3.5
    assert miss["differs"][0]["changes"] == ["removed --xla_cpu_fast=true"]
    assert {m["cause"] for m in out["misses"] if m["run_id"] == "r0"} == {"new_program"}
    assert cli_main(["explain", str(root), "--run", "r1"]) == 0
    table = " ".join(capsys.readouterr().out.split())  # wrapped to the terminal's width
    assert "xla_flags" in table and "give the warm-up the job's XLA_FLAGS" in table and "3.5" in table
    assert cli_main(["explain", str(root), "--since", "soon"]) == 2


def test_compile_options_that_move_with_flags_or_devices_are_not_the_cause():
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0")], {old: EntryNow(old, NOW - 100)})
    sharded = explain(known(K, "write", NOW, p=parts(computation="x", compile_options="y", devices="z")), hist)
    assert sharded.cause == "devices" and [d.part for d in sharded.differs] == [
        "computation", "compile_options", "devices"]
    assert explain(known(K, "write", NOW, p=parts(compile_options="y")), hist).cause == "compile_options"


def test_compile_options_that_differ_are_named_with_both_values():
    """An uncommitted argument changes the program and one option: the cause names the option, old and new."""
    old = key("jit_step", "old")
    written = ((("allow_spmd_sharding_propagation_to_parameters", "[False ×2]"), ("use_spmd_partitioning", "True")))
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0", p=replace_parts(options=written))],
                       {old: EntryNow(old, NOW - 100)})
    mine = (("allow_spmd_sharding_propagation_to_parameters", "[False, True]"),
            ("compiler_options.xla_cpu_enable_fast_math", "True"), ("use_spmd_partitioning", "True"))
    why = explain(known(K, "write", NOW, p=replace_parts(computation="x", compile_options="y", options=mine)), hist)
    assert why.cause == "compile_options", why
    options = next(d for d in why.differs if d.part == "compile_options")
    assert options.changes == ("allow_spmd_sharding_propagation_to_parameters: [False ×2] → [False, True]",
                               "compiler_options.xla_cpu_enable_fast_math: (default) → True")
    assert "allow_spmd_sharding_propagation_to_parameters: [False ×2] → [False, True]" in why.fix
    assert "NamedSharding" in why.fix


def test_records_without_option_fields_explain_as_before():
    old = key("jit_step", "old")
    hist = FakeHistory([known(old, "write", NOW - 100, run="r0")], {old: EntryNow(old, NOW - 100)})
    new = (("use_spmd_partitioning", "False"),)
    why = explain(known(K, "write", NOW, p=replace_parts(compile_options="y", options=new)), hist)
    assert why.cause == "compile_options" and why.differs[0].changes == () and "values not recorded" in why.fix


def replace_parts(*, options: tuple | None = None, **changed: str) -> KeyParts:
    return msgspec.structs.replace(parts(**changed), options=options)


def test_a_job_or_run_no_record_names_is_an_error_that_suggests_the_recorded_ones(tmp_path, capsys):
    from jaxcache.records import KeyUsage, RunRecord

    root = tmp_path / "cache"
    root.mkdir()
    assert cli_main(["explain", str(root), "--job", "train"]) == 2
    assert "no run or warm-up records" in capsys.readouterr().err
    t = time.time()
    for job, run, event in (("demo-train", "r1", "hit"), ("demo-eval", "r2", "write")):
        record = RunRecord(job=job, run_id=run, process_index=0, process_count=1, host="h", started_at=t,
                           updated_at=t, fingerprint=FP, final=True,
                           keys=[KeyUsage(key=key("jit_step", job), event=event, compiles=int(event != "hit"),
                                          writes=int(event == "write"), first_at=t, parts=parts(), program=SIG)])
        (root / record.name).parent.mkdir(parents=True, exist_ok=True)
        (root / record.name).write_bytes(record.to_json())
    capsys.readouterr()
    for args in (["--job", "demo-trian"], ["--job", "demo-trian", "--json"], ["--run", "r3"]):
        assert cli_main(["explain", str(root), *args]) == 2, args
        out = capsys.readouterr()
        assert out.out == "" and len(out.err.strip().splitlines()) == 1, out
    assert cli_main(["explain", str(root), "--job", "demo-trian"]) == 2
    assert "names that job; did you mean 'demo-train'" in capsys.readouterr().err
    assert cli_main(["explain", str(root), "--job", "nosuch"]) == 2
    assert "jobs recorded: demo-eval, demo-train" in capsys.readouterr().err
    # A recorded job with no misses (only hits) is no error: it ran and missed nothing.
    assert cli_main(["explain", str(root), "--job", "demo-train"]) == 0
    assert "no misses recorded" in capsys.readouterr().out
    assert cli_main(["explain", str(root), "--run", "r2", "--json"]) == 0
    assert [m["job"] for m in json.loads(capsys.readouterr().out)["misses"]] == ["demo-eval"]


WIDE_OLD = ProgramSignature(
    args=('f32[64,128] sharding=<mesh<["data"=2]>, [{}, {}]>',
          'f32[16,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]>'),
    results=('f32[] sharding=<mesh<["data"=2]>, []>',))
WIDE_NEW = ProgramSignature(
    args=('f32[64,128] sharding=<mesh<["data"=2]>, [{}, {}]>',
          'f32[32,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]>'),
    results=('f32[] sharding=<mesh<["data"=2]>, []>',))


#: What `explain --json` printed for _wide_root before the text output changed (#60).
EXPECTED_JSON = {'root': 'ROOT',
 'misses': [{'function': 'jit_step',
             'key': 'jit_step-405ea565bcf4773f753be1e051f021e470163de3652827e5f11ee746618c2739',
             'job': 'demo-job',
             'run_id': 'r1',
             'process_index': 0,
             'compile_s': 0.68,
             'cause': 'program_changed',
             'differs': [{'part': 'computation',
                          'mine': '(f32[64,128] sharding=<mesh<["data"=2]>, [{}, {}]>, f32[32,64] '
                                  'sharding=<mesh<["data"=2]>, [{"data"}, {}]>) -> (f32[] '
                                  'sharding=<mesh<["data"=2]>, []>)',
                          'theirs': '(f32[64,128] sharding=<mesh<["data"=2]>, [{}, {}]>, f32[16,64] '
                                    'sharding=<mesh<["data"=2]>, [{"data"}, {}]>) -> (f32[] '
                                    'sharding=<mesh<["data"=2]>, []>)',
                          'changes': ['argument 1: f32[16,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]> → '
                                      'f32[32,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]>']}],
             'nearest': 'jit_step-3b7e9da2df5de9523282424656a51ce393523866f9179f93a92744353ad76cba',
             'fix': 'jit_step is not the program the cache has: argument 1: f32[16,64] sharding=<mesh<["data"=2]>, '
                    '[{"data"}, {}]> → f32[32,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]>. Only shapes or '
                    'dtypes changed: bucket or pad inputs to a few shapes, or warm up each shape the job uses '
                    '(`warmup --entrypoint ...`)'},
            {'function': 'jit_step',
             'key': 'jit_step-3b7e9da2df5de9523282424656a51ce393523866f9179f93a92744353ad76cba',
             'job': 'demo-job',
             'run_id': 'r0',
             'process_index': 0,
             'compile_s': 0.6,
             'cause': 'new_program',
             'differs': [],
             'nearest': None,
             'fix': "the first time this cache sees jit_step: warm it up (`warmup --entrypoint ...` with the job's "
                    'topology) or let one run write it'},
            {'function': 'jit_step',
             'key': 'jit_step-405ea565bcf4773f753be1e051f021e470163de3652827e5f11ee746618c2739',
             'job': 'demo-job',
             'run_id': 'r2',
             'process_index': 0,
             'compile_s': 0.51,
             'cause': 'not_written',
             'differs': [],
             'nearest': None,
             'fix': 'an earlier run compiled it in less time than jax_persistent_cache_min_compile_time_secs and '
                    'JAX did not store it (compiled in 0.68 s, under '
                    'jax_persistent_cache_min_compile_time_secs=1): lower the threshold '
                    '(enable_cache(min_compile_time_secs=0))'}],
 'skipped_records': 0}


def _wide_root(tmp_path):
    """The demo's story in records: r0 wrote the program for 16 rows, r1 compiled it for 32 (not stored: under the
    threshold), r2 compiled that again."""
    from jaxcache.records import KeyUsage, RunRecord

    root = tmp_path / "cache"
    root.mkdir()
    now = time.time()  # after the entry's file: it was written by r0, not there before it
    old, new = key("jit_step", "b16"), key("jit_step", "b32")
    reason = "compiled in 0.68 s, under jax_persistent_cache_min_compile_time_secs=1"
    for run, at, usage in (
        ("r0", now - 300, KeyUsage(key=old, event="write", compiles=1, writes=1, first_at=now - 300, compile_s=0.6,
                                   parts=parts(), program=WIDE_OLD)),
        ("r1", now - 200, KeyUsage(key=new, event="compiled", compiles=1, first_at=now - 200, compile_s=0.68,
                                   reason=reason, parts=parts(computation="b32"), program=WIDE_NEW)),
        ("r2", now - 100, KeyUsage(key=new, event="compiled", compiles=1, first_at=now - 100, compile_s=0.51,
                                   reason=reason.replace("0.68", "0.51"), parts=parts(computation="b32"),
                                   program=WIDE_NEW)),
    ):
        record = RunRecord(job="demo-job", run_id=run, process_index=0, process_count=1, host="h", started_at=at,
                           updated_at=at, fingerprint=FP, final=True, keys=[usage])
        (root / record.name).parent.mkdir(parents=True, exist_ok=True)
        (root / record.name).write_bytes(record.to_json())
    (root / f"{old}-cache").write_bytes(b"x")
    return root


@pytest.mark.parametrize("columns", ["200", "100", "80"])
def test_the_text_output_reads_in_a_100_column_terminal(tmp_path, capsys, monkeypatch, columns):
    """One block per cause and function (#60): no line wider than the terminal or 100 columns, and the fix refers
    to the changes listed above it instead of repeating them."""
    monkeypatch.setenv("COLUMNS", columns)
    root = _wide_root(tmp_path)
    assert cli_main(["explain", str(root)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= min(100, int(columns)), out
    assert lines[0] == "program_changed: jit_step, 1 miss, 0.7 compile seconds", out
    assert "not_written: jit_step, 1 miss, 0.5 compile seconds" in lines, out
    change = 'argument 1: f32[16,64] sharding=<mesh<["data"=2]>, [{"data"}, {}]> → f32[32,64]'
    assert " ".join(out.split()).count(" ".join(change.split())) == 1, out  # under "computation differs", only
    fix = " ".join(out.split("fix: ", 1)[1].split("\n\n")[0].split())
    assert fix.startswith("jit_step is not the program the cache has: the changes above. Only shapes"), fix
    assert "new_program: jit_step, 1 miss, 0.6 compile seconds" in lines, out
    assert out.endswith("\n3 misses, 1.8 compile seconds\n")


def test_the_json_output_is_as_before(tmp_path, capsys):
    """`--json` keeps its fields and values whatever the text output does (#60)."""
    root = _wide_root(tmp_path)
    assert cli_main(["explain", str(root), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {**EXPECTED_JSON, "root": str(root)}
