"""Schemathesis against /openapi.json over real HTTP: no 500, and no answer that breaks the
API's own schema (statuses, content types, bodies and headers all as declared).

The operations are driven through Hypothesis directly rather than through Schemathesis's
pytest plugin, whose lazy-fixture loader does not run under the pytest this project uses.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from tests.api.conftest import Api
from tests.support.services import examples

# A schema-valid request may still be refused for what only the server can know: an id
# that does not exist (404), a card in the wrong state (409), a version the store never
# gave out (422), a declared size over the configured limit (413).
ACCEPTABLE_FOR_VALID_DATA = ["2xx", "3xx", "401", "403", "404", "409", "413", "422"]
# Invalid data must be refused; a 413 for an oversized body is a refusal too.
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422"]
EXAMPLES = examples(30)


def test_api_honours_its_schema(local_api: Api) -> None:
    api = local_api
    key = api.make_key("fuzzer", admin=True)
    auth = {"Authorization": f"Bearer {key}"}
    config = SchemathesisConfig.from_dict(
        {
            "headers": auth,
            "generation": {"database": "none"},
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ACCEPTABLE_FOR_VALID_DATA},
                "negative_data_rejection": {"expected-statuses": REFUSALS},
            },
        }
    )
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json", config=config)
    failures: list[str] = []
    operations = 0
    calls = 0
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result  # the schema itself must be valid
        operation = result.ok()
        if operation.path == "/v1/events":
            # An event stream never ends, so no client can read its whole body; its
            # contract is tests/api/test_events.py's.
            continue
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                nonlocal calls
                calls += 1
                case.call_and_validate(headers=auth)

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing in it can be made invalid
            except (Exception, BaseExceptionGroup) as exc:  # report every operation's
                failures.append(f"{operation.label} [{mode}]: {exc}")
    assert operations >= 10
    # Really exercised, not skipped: a third of both modes' examples at least.
    assert calls >= operations * 2 * EXAMPLES // 3, calls
    assert not failures, "\n\n".join(failures)
