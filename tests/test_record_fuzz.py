"""Fuzzed records against every reader: a run or warm-up record, however malformed, parses or is refused with our
error, and one that parses always fits the catalog (SQLite and PostgreSQL), whose columns the schema's limits
match."""

from __future__ import annotations

import copy
import json

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxcache import coverage, records
from jaxcache.errors import InvalidInputError
from jaxcache.keyparts import ORDER, KeyParts, ProgramSignature
from jaxcache.service.catalog.database import Catalog
from jaxcache.service.metrics import STORAGE
from jaxcache.service.reports.ingest.queue import ingest
from jaxcache.service.warmups import ingest as warmups

KEY = "jit_train_step-" + "a" * 64
SHA = "b" * 64

# Values at and past the limits that matter: the catalog's integer and string widths, NUL, multi-byte text.
EDGES = st.sampled_from([
    2**31 - 1, 2**31, 2**53, 2**63, 2**64, -1, records.MAX_SECONDS, records.MAX_SECONDS + 1, -1e13, 0.5,
    "x" * 1000, "x" * 1001, "é" * 1000,
    "字" * 256, "a\x00b", "", "jit_f-" + "a" * 64, "j" * 450 + "-" + "c" * 64, "0" * 64, "A" * 64, [], {},
    "zstandard", "write", "hit", "compiled", "job", "warmup", "written", "present", "4x8x1", "0x1x1", "cpu",
])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | st.text(max_size=40)
    | EDGES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=6,
)


def _run_record() -> dict:
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu", device_kind="cpu", device_count=1,
                             compression="zstandard", python="3.11.9")
    usage = [records.KeyUsage(key=KEY, event="write", compiles=1, writes=1, compile_s=2.0, size_bytes=100,
                              first_at=1.7e9, last_at=1.7e9, sha256=SHA,
                              parts=KeyParts(**{part: "d" * 64 for part in ORDER},
                                             options=(("use_spmd_partitioning", "True"),
                                                      ("compiler_options.xla_cpu_enable_fast_math", "False"))),
                              program=ProgramSignature(args=("f32[8,128]",), results=("f32[8,128]",))),
             records.KeyUsage(key="jit_eval-" + "c" * 64, event="hit", hits=3, retrieval_s=0.1, saved_s=5.0,
                              first_at=1.7e9, last_at=1.7e9 + 1)]
    record = records.RunRecord(job="train", run_id="r1", process_index=0, process_count=2, host="node-1",
                               started_at=1.7e9, updated_at=1.7e9 + 10, fingerprint=fp, topology="1x1x2",
                               cache_dir="/cache", final=True, pid=123, keys=usage)
    return json.loads(record.to_json())


def _warmup_record() -> dict:
    fp = records.Fingerprint(jax="0.10.2", jaxlib="0.10.2", backend="cpu")
    warm = coverage.WarmupRecord(
        id="w1", job="train", topology="1x1x2", platform="cpu", started_at=1.7e9, finished_at=1.7e9 + 5,
        fingerprint=fp, cache_dir="/cache",
        programs=[coverage.ProgramCoverage(key=KEY, function="train_step", status="written", size_bytes=100,
                                           sha256=SHA)])
    return json.loads(warm.to_json())


def _paths(value, prefix=()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


BASES = {"run": _run_record(), "warmup": _warmup_record()}
PATHS = {kind: _paths(base) for kind, base in BASES.items()}


@st.composite
def mutated(draw, kind: str) -> bytes:
    """The valid record with one or two fields replaced, removed or added."""
    data = copy.deepcopy(BASES[kind])
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(PATHS[kind]))
        parent = data
        try:
            for part in path[:-1]:
                parent = parent[part]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed or replaced the way there
        last, op = path[-1], draw(st.sampled_from(["set", "edge", "edge", "edge", "delete", "add"]))
        fits = (isinstance(parent, dict) and isinstance(last, str)) or (
            isinstance(parent, list) and isinstance(last, int) and last < len(parent))
        if not fits:
            continue
        if op == "delete" and isinstance(parent, dict):
            parent.pop(last, None)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(JSON)
        else:
            parent[last] = draw(EDGES if op == "edge" else JSON)
    return msgspec.json.encode(data)


_, SCHEMAS = msgspec.json.schema_components([records.RunRecord])
_FREE_TEXT = "^[^\\x00]*$"


def _largest(struct: str, field: str):
    """The largest value the schema allows for a field (read from the schema itself, so that loosening a limit
    beyond what the catalog stores shows here), or None for a field whose pattern needs a hand-made value."""
    spec = SCHEMAS[struct]["properties"][field]
    spec = next((s for s in spec.get("anyOf", [spec]) if s.get("type") != "null"), spec)
    if spec.get("type") == "integer":
        return spec["exclusiveMaximum"] - 1 if "exclusiveMaximum" in spec else spec.get("maximum")
    if spec.get("type") == "number":
        return spec.get("maximum")
    if spec.get("type") == "string" and "maxLength" in spec and spec.get("pattern", _FREE_TEXT) == _FREE_TEXT:
        return "字" * spec["maxLength"]  # multi-byte: columns count characters, not bytes
    return None


@st.composite
def at_limits(draw) -> bytes:
    """A valid run record whose fields are drawn between typical values and the largest the schema allows."""
    def fill(struct: str, typical: dict) -> dict:
        out = {}
        for name, value in typical.items():
            largest = _largest(struct, name) if name in SCHEMAS[struct]["properties"] else None
            out[name] = value if largest is None else draw(st.sampled_from([value, largest]))
        return out

    record = fill("RunRecord", {k: v for k, v in BASES["run"].items() if k not in ("fingerprint", "keys")})
    record["process_index"] = min(record["process_index"], record["process_count"] - 1)
    record["fingerprint"] = fill("Fingerprint", {k: v for k, v in BASES["run"]["fingerprint"].items()
                                                 if k != "digest"})
    usage = fill("KeyUsage", BASES["run"]["keys"][0])
    usage["key"] = draw(st.sampled_from([KEY, "k" * 447 + "-" + "d" * 64]))  # the key column's width
    record.update(job=draw(st.sampled_from(["train", "j" * 200])), run_id=draw(st.sampled_from(["r1", "R" * 128])),
                  keys=[usage])
    return msgspec.json.encode(record)


def _parses_or_refuses(parse, data: bytes):
    try:
        found = parse(data)
    except InvalidInputError:
        event("refused")
        return None
    event("parsed")
    return found


def test_a_run_record_says_its_schema_first_and_reads_back_as_written():
    """The tag before the keys: a reader finds it without scanning past 200 keys' worth of JSON first."""
    data = _run_record()
    assert next(iter(data)) == "schema"
    body = json.dumps(data).encode()
    assert records.parse(body).to_json() == body.replace(b", ", b",").replace(b": ", b":")


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=mutated("run") | st.binary(max_size=64))
def test_run_records_parse_or_are_refused_with_our_error(data):
    _parses_or_refuses(records.parse, data)


@FUZZ
@given(data=mutated("run") | at_limits())
def test_a_record_that_parses_reads_for_folding_with_the_same_figures(data):
    """The service reads what its inbox holds (validated on the way in) without the checks and without decoding
    the keys' texts until asked: every field still reads as the validator read it."""
    record = _parses_or_refuses(records.parse, data)
    if record is None:
        return
    folded = records.parse_figures(record.to_json())
    mine = {f: getattr(record, f) for f in record.__struct_fields__ if f != "keys"}
    assert {f: getattr(folded, f) for f in mine} == mine
    assert len(folded.keys) == len(record.keys)
    for whole, read in zip(record.keys, folded.keys, strict=True):
        for f in whole.__struct_fields__:
            assert records.text_of(read, f) == getattr(whole, f), f


@FUZZ
@given(data=mutated("warmup") | st.binary(max_size=64))
def test_warmup_records_parse_or_are_refused_with_our_error(data):
    _parses_or_refuses(coverage.parse, data)


@pytest.fixture
def catalog(catalog_url):
    catalog = Catalog(catalog_url)
    yield catalog
    catalog.dispose()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated("run") | at_limits())
def test_every_run_record_that_parses_fits_the_catalog(catalog, data):
    record = _parses_or_refuses(records.parse, data)
    if record is not None:
        try:
            ingest(catalog, "demo", record, source=STORAGE, name=record.name)
        except InvalidInputError as exc:  # the one refusal left to ingestion: a key listed twice
            assert "twice" in str(exc)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated("warmup"))
def test_every_warmup_record_that_parses_fits_the_catalog(catalog, data):
    warm = _parses_or_refuses(coverage.parse, data)
    if warm is not None:
        warmups.ingest(catalog, "demo", warm, record_name=warm.name)
