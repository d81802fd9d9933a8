"""A POSTed record's keys checked against their patterns all at once (ingestion/patterns.py): the same records
accepted, with the same values, and the same refusals, word for word, as the record format's own types give."""

from __future__ import annotations

import json
import time
import typing

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.keyparts import KeyParts
from jaxcache.records import KeyUsage
from jaxcache.service.ingestion import packed, patterns
from reports_support import compiled, hit, run, sha, write

HEX = "0123456789abcdef"


def _body(keys: list[dict]) -> bytes:
    at = time.time()
    base = json.loads(run("job", "r1", [hit("jit_a-" + "a" * 64, 1, at)], at=at, process_index=0,
                          process_count=2).to_json())
    return json.dumps({**base, "keys": keys}).encode()


def _outcome(body: bytes) -> tuple[str, object]:
    """What the route's parse makes of ``body``: its report, or its error's message."""
    try:
        return "report", msgspec.to_builtins(packed.report_of_json(body))
    except InvalidInputError as exc:
        return "refused", str(exc)


def _strict(body: bytes) -> tuple[str, object]:
    """The same from the record format's own types, every pattern matched key by key."""
    try:
        report = packed.report_of(records.parse(body))
    except InvalidInputError as exc:
        return "refused", str(exc)
    # A digest's key carries no parts or program: an attestation reads its digest, size and signature.
    report.digests = [msgspec.structs.replace(u, parts=None, program=None) for u in report.digests]
    return "report", msgspec.to_builtins(report)


def _key(at: float) -> dict:
    parts = KeyParts(computation=sha("c"), jaxlib=sha("j"))
    return json.loads(msgspec.json.encode(msgspec.structs.replace(write("jit_w-" + "d" * 64, 2.5, at), parts=parts,
                                                                  sha256=sha("bytes"), size_bytes=12)))


def test_an_ordinary_record_takes_the_quick_way_and_parses_as_the_whole_record_does():
    at = time.time()
    record = run("job", "r1", [write("jit_a-" + "a" * 64, 2.5, at), hit("jit_b-" + "b" * 64, 3, at),
                               compiled("jit_c-" + "c" * 64, 1.5, at)], at=at, process_index=1, process_count=4)
    body = record.to_json()
    assert packed._quick(body) is not None
    assert _outcome(body) == _strict(body)


@pytest.mark.parametrize("schema", [None, "jaxcache.run/0", 5])
def test_a_record_without_its_schema_tag_is_refused_as_the_record_format_refuses_it(schema):
    data = json.loads(_body([_key(time.time())]))
    if schema is None:
        del data["schema"]
    else:
        data["schema"] = schema
    body = json.dumps(data).encode()
    assert packed._quick(body) is None
    got = _outcome(body)
    assert got == _strict(body) and got[0] == "refused"


def test_every_pattern_of_a_keys_fields_has_a_whole_record_check():
    patterned = set()
    for name, hint in typing.get_type_hints(KeyUsage, include_extras=True).items():
        if "pattern=" in repr(hint):
            patterned.add(name)
    assert {name for name, _ in packed._CHECKS} == patterned
    assert "pattern=" not in repr(packed._unpatterned)


@pytest.mark.parametrize("field, value", [
    ("key", "jit_a-" + "a" * 64 + "\n"),  # "$" matches before a final newline: the record format takes it
    ("key", "jit/a-" + "a" * 64), ("key", "-" + "a" * 64), ("key", "jit_a-" + "A" * 64), ("key", "jit_a" + "a" * 64),
    ("key", "jit_a-" + "a" * 63), ("key", "jit\x00a-" + "a" * 64), ("key", "jit a-" + "a b" * 32),
    ("key", "jit_a-" + " a" * 32), ("key", "jit_a-" + "é" * 64),
    ("function", "jit\x00a"), ("function", ""), ("reason", "no\x00"), ("reason", "x\n"),
    ("sha256", "A" * 64), ("sha256", "a" * 63), ("sha256", "a" * 64 + "\n"), ("sha256", " a" * 32),
    ("signature", "g" * 64), ("signature", "a" * 65),
])
def test_a_key_field_the_quick_check_doubts_gets_the_record_formats_answer(field, value):
    at = time.time()
    keys = [_key(at), _key(at)]
    keys[0]["key"] = "jit_v-" + "e" * 64
    keys[1][field] = value
    body = _body(keys)
    assert _outcome(body) == _strict(body)


def test_of_two_faults_the_first_in_the_record_is_the_one_reported():
    at = time.time()
    keys = [_key(at), _key(at), _key(at)]
    keys[0]["key"] = "jit/x-" + "e" * 64  # a pattern the quick check would only see after decoding the rest
    keys[1]["key"] = "jit_y-" + "f" * 64
    keys[2]["hits"] = -1
    got = _outcome(_body(keys))
    assert got == _strict(_body(keys)) and got[0] == "refused" and "$.keys[0].key" in str(got[1])


_text = st.text(alphabet=st.sampled_from(["a", "-", "/", "\x00", "\n", " ", "A", "é", *HEX]), max_size=70)
_hex64 = st.one_of(st.text(alphabet=HEX, min_size=64, max_size=64), _text)
_keys = st.one_of(st.builds(lambda head, tail: f"{head}-{tail}", _text, _hex64), _text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.fixed_dictionaries({}, optional={"key": _keys, "function": _text, "reason": st.none() | _text,
                                                     "sha256": st.none() | _hex64, "signature": st.none() | _hex64}),
                min_size=1, max_size=4))
@example([{"key": "jit_a-" + "a" * 64 + "\n"}])
def test_any_key_fields_parse_as_the_record_format_says(changes):
    at = time.time()
    keys = []
    for i, change in enumerate(changes):
        key = _key(at)
        key["key"] = f"jit_{i}-" + HEX[i] * 64
        keys.append({**key, **change})
    body = _body(keys)
    assert _outcome(body) == _strict(body)


def test_the_checks_on_their_own():
    assert patterns._keys([]) and patterns._keys(["a-" + "0" * 64, "b/c-d-" + "f" * 64][:1])
    assert not patterns._keys(["b/c-" + "f" * 64]) and not patterns._keys(["a-" + "F" * 64])
    assert patterns._hex64(["ab" * 32]) and not patterns._hex64(["ab" * 31 + "a "])
    assert patterns._no_nul(["x", "y\n"]) and not patterns._no_nul(["x", "\x00"])
