"""A POSTed record's parsing (ingestion/packed.report_of_json): its keys' parts and programs kept as the JSON they
came as, checked once per distinct text, and the same Report, and the same refusals, as parsing the whole record."""

from __future__ import annotations

import json
import re
import time

import msgspec
import pytest

from jaxcache import records
from jaxcache.errors import InvalidInputError
from jaxcache.keyparts import KeyParts, ProgramSignature
from jaxcache.service.ingestion import packed
from reports_support import compiled, hit, run, sha, write


def _record() -> records.RunRecord:
    at = time.time()
    parts = KeyParts(computation=sha("c"), jaxlib=sha("j"), devices=sha("d"))
    program = ProgramSignature(args=("f32[32,128]", "i32[]"), results=("f32[32]",))
    keys = [msgspec.structs.replace(write("jit_a-" + "a" * 64, 2.5, at), parts=parts, program=program,
                                    sha256=sha("bytes"), size_bytes=1234),
            msgspec.structs.replace(hit("jit_b-" + "b" * 64, 3, at), parts=parts),
            compiled("jit_c-" + "c" * 64, 1.5, at)]
    return run("job", "r1", keys, at=at, process_index=1, process_count=4)


def test_a_record_parses_to_the_same_report_either_way():
    body = _record().to_json()
    whole = packed.report_of(records.parse(body))
    # A digest's key carries no parts or program: an attestation reads its digest, size and signature.
    whole.digests = [msgspec.structs.replace(u, parts=None, program=None) for u in whole.digests]
    for _ in range(2):  # the second time, its texts are known already
        assert packed.report_of_json(body) == whole
    got = packed.report_of_json(body)
    assert got.parts[0] == got.parts[1] and got.parts[2] is None and got.programs[1] is None
    assert [u.key for u in got.digests] == [got.keys[0]] and got.digests[0].parts is None


@pytest.mark.parametrize("field, value, where", [
    ("parts", {"computation": 5}, "$.keys[1].parts.computation"),
    ("parts", [1], "$.keys[1].parts"),
    ("program", {"args": "f32"}, "$.keys[1].program.args"),
])
def test_a_malformed_part_is_refused_where_it_is_whatever_came_before(field, value, where):
    data = json.loads(_record().to_json())
    packed.report_of_json(json.dumps(data).encode())  # the record's good texts are known
    data["keys"][1][field] = value
    body = json.dumps(data).encode()
    with pytest.raises(InvalidInputError, match=f"run record is malformed: .* - at `{re.escape(where)}`"):
        packed.report_of_json(body)
    with pytest.raises(InvalidInputError) as whole:
        records.parse(body)
    with pytest.raises(InvalidInputError) as kept:
        packed.report_of_json(body)
    assert str(kept.value) == str(whole.value)


def test_the_texts_known_stay_bounded(monkeypatch):
    monkeypatch.setattr(packed, "KNOWN_TEXTS", 3)
    monkeypatch.setattr(packed, "_known", {})
    for i in range(10):
        data = json.loads(_record().to_json())
        data["keys"][1]["parts"] = {"computation": sha(str(i))}
        packed.report_of_json(json.dumps(data).encode())
        assert len(packed._known) <= 3
