"""What schemathesis cannot read from the OpenAPI document: rules between fields of a run record, which JSON Schema
cannot state (the record format's validator, jaxcache.records, and ingestion check them and answer 422), and the
served cache's root (the drawn roots of ``GET /v1/integrity``, ``GET /v1/working-set`` and ``POST
/v1/integrity/digests`` all answer 404). Positive
cases are made to keep them; negative ones are left as drawn. Loaded by tests/test_service_contract.py, or by hand:
``SCHEMATHESIS_HOOKS=tests/schemathesis_hooks.py JAXCACHE_CONTRACT_ROOT=/path st run ...``."""

from __future__ import annotations

import os
from typing import Any

import schemathesis
from schemathesis.generation import GenerationMode


def _whole(value: Any) -> bool:
    # JSON Schema's integers include 3.0.
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


@schemathesis.hook("map_case").apply_to(operation_id="ingestReport")
def a_record_keeps_the_rules_between_its_fields(context: Any, case: Any) -> Any:
    body = case.body
    if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE or not isinstance(body, dict):
        return case
    index, count = body.get("process_index"), body.get("process_count")
    if _whole(index) and _whole(count) and count >= 1 and index >= count:
        body["process_index"] = int(index) % int(count)  # a process of the run: below process_count
    keys = body.get("keys")
    if isinstance(keys, list) and all(isinstance(k, dict) for k in keys):
        firsts = {}
        for usage in keys:  # one entry per key
            firsts.setdefault(usage.get("key"), usage)
        body["keys"] = list(firsts.values())
    return case


@schemathesis.hook("map_case").apply_to(operation_id=["getIntegrityByDir", "getWorkingSetByDir"])
def ask_about_the_served_root(context: Any, case: Any) -> Any:
    root = os.environ.get("JAXCACHE_CONTRACT_ROOT")
    if root and case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE and case.query:
        case.query["cache_dir"] = root
    return case


@schemathesis.hook("map_case").apply_to(operation_id="getAttestedDigests")
def ask_for_digests_of_the_served_root(context: Any, case: Any) -> Any:
    root = os.environ.get("JAXCACHE_CONTRACT_ROOT")
    if root and case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE and isinstance(
            case.body, dict):
        case.body["cache_dir"] = root
    return case
