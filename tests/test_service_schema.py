"""schemathesis against the served OpenAPI document: no 5xx, and every response matches its schema."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, settings

schemathesis = pytest.importorskip("schemathesis")

from jaxcache.service.app import create_app  # noqa: E402
from jaxcache.service.rounds import rescan_cache  # noqa: E402
from jaxcache.service.settings import ServiceSettings  # noqa: E402

ADMIN = "schema-admin"


@pytest.fixture
def api_schema(tmp_path, cache_copy):
    app = create_app(ServiceSettings(
        caches={"demo": str(cache_copy)}, db=f"sqlite:///{tmp_path / 'c.sqlite'}", rescan_s=3600,
        tokens={hashlib.sha256(ADMIN.encode()).hexdigest(): "admin"},
    ))
    rescan_cache(app.state.jaxcache, "demo")
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def test_api_conforms(api_schema):
    # Each operation's generated cases, driven by hypothesis directly (schemathesis' pytest plugin lags pytest).
    from hypothesis import given
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            case.call_and_validate(
                headers={"Authorization": f"Bearer {ADMIN}"},
                checks=[not_a_server_error, response_schema_conformance, status_code_conformance],
            )

        check()


def test_the_report_body_in_openapi_is_the_record_formats_own_schema(tmp_path):
    from jaxcache import records

    app = create_app(ServiceSettings(caches={}, db=f"sqlite:///{tmp_path / 'c.sqlite'}"))
    components = app.openapi()["components"]["schemas"]
    _, own = records.json_schema()
    assert set(components["RunRecord"]["properties"]) == set(own["RunRecord"]["properties"])
    assert components["KeyUsage"] == own["KeyUsage"] and components["Fingerprint"] == own["Fingerprint"]
    assert not {"RunRecordModel", "KeyUsageModel", "FingerprintModel"} & set(components)  # the format's own names
    body = app.openapi()["paths"]["/v1/reports"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/RunRecord"}
    assert components["RunRecord"]["properties"]["keys"]["items"] == {"$ref": "#/components/schemas/KeyUsage"}
