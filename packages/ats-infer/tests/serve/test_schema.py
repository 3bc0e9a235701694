"""schemathesis against the live server's own OpenAPI schema (loopback, a bounded number of
generated requests per route): no 5xx, and every status, content type and body is one the schema
documents."""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import API_KEY

MAX_EXAMPLES = 30  # per route
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.mark.slow
def test_server_conforms_to_its_schema(server) -> None:
    api = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {API_KEY}"}
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == 7  # every route is exercised
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), database=None)  # fmt: skip
        def conforms(case) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        conforms()
