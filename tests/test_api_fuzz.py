"""Property-based API fuzzing with schemathesis: the API says what it enforces.

Every operation of /openapi.json gets schema-valid and schema-violating requests (examples,
coverage and fuzzing phases; a fixed seed and a bounded number of cases, so the run is the same
every time and takes seconds). Checked: no 500, status codes and bodies as documented, every
schema-valid request accepted, every schema-violating one rejected, every 405 with an `Allow`
header listing the path's methods.

Two departures from the stock checks, both narrow:
- the cross-field rules JSON Schema cannot state (RULES below; each is in the schema's
  descriptions) may reject a schema-valid request, and then must: with 422, or as an ingest
  item in `rejected`;
- an ingest batch keeps its good items: a schema-violating batch may be answered 200 when the
  answer's `rejected` lists the bad items.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from nms.app.api import create_app
from nms.app.service import Service
from nms.records import INGEST_KINDS, PortSample, TelemetryRecord
from nms.store.base import INT64_MAX, Point, validate_point
from tests.helpers import auth, make_config

MAX_EXAMPLES = 15
SEED = 27

_DATA = Path(tempfile.mkdtemp(prefix="nms-fuzz-"))
_SERVICE = Service(make_config(_DATA, api={"max_body_bytes": 1_000_000}))
app = create_app(_SERVICE, manage_lifecycle=False)
schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=SchemathesisConfig.from_str(f"""
seed = {SEED}
[generation]
mode = "all"
max-examples = {MAX_EXAMPLES}
[phases.stateful]
enabled = false
"""))


def teardown_module():
    _SERVICE.store.close()
    _SERVICE.state.close()


# --- the cross-field rules: what a schema-valid request may still be refused for --------------------


def _item_breaks_rule(kind: str, item: dict) -> bool:
    """Whether an ingest item breaks a rule the schema cannot state (documented in the record types)."""
    model = INGEST_KINDS[kind]
    if kind == "points":  # a raw point follows the store's rules (nms.store.base.validate_point)
        point = Point(item["measurement"], dict(item.get("tags", {})), dict(item["fields"]), item["ts"])
        return validate_point(point) is not None
    if issubclass(model, TelemetryRecord) and all(item.get(k) is None for k in model._value_keys):
        return True  # a point needs at least one field
    if kind == "probe_windows":
        pairs, pure = item.get("pairs"), item.get("pure_pairs")
        return item["received"] > item["sent"] or (pairs is not None and pure is not None and pure > pairs)
    if kind == "nccl_step_stats":
        return item["stop_ns"] <= item["start_ns"]
    if kind == "port_samples":
        return item.get("counter_bits") == 32 and any((item.get(c) or 0) >= 1 << 32
                                                  for c in PortSample.traffic_counters)
    return False


def _breaks_rule(case) -> bool:
    """Whether a request (not an ingest batch) breaks a rule the schema cannot state."""
    path, method, query = case.operation.path, case.method.upper(), case.query or {}
    body = case.body if isinstance(case.body, dict) else {}
    if (method, path) == ("POST", "/jobs"):
        hosts = set(body.get("hosts", []))
        end = body.get("end")
        return ((end is not None and end < body["start"])
                or any(nic.split(":", 1)[0] not in hosts for nic in body.get("nics", []))
                or any(rank["host"] not in hosts for rank in body.get("ranks", [])))
    if (method, path) == ("POST", "/telemetry/query"):
        return body["end"] <= body["start"]
    if (method, path) == ("GET", "/incidents"):
        since, until = query.get("since"), query.get("until")
        return since is not None and until is not None and int(until) < int(since)
    if method == "POST" and path in ("/agents/commands", "/agents/{host}/commands"):
        return len(json.dumps(body.get("args", {}))) > 4096  # args: at most DETAILS_MAX bytes as JSON
    return False


def _ingest_kind(case) -> str | None:
    path = case.operation.path
    return path.removeprefix("/ingest/") if path.startswith("/ingest/") and case.method.upper() == "POST" else None


def _positive(case) -> bool:
    return case.meta is not None and case.meta.generation.mode.is_positive


def _huge_int(value) -> bool:
    if isinstance(value, dict):
        return any(_huge_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_huge_int(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and value > INT64_MAX


def positive_data_accepted(ctx, response, case):
    """positive_data_acceptance, but a documented cross-field rule may refuse (and then must)."""
    if _positive(case) and (_huge_int(case.body) or _huge_int(case.query)):
        return None  # schemathesis rounds a maximum near 2^63 through a float and oversteps it
    kind = _ingest_kind(case)
    if _positive(case) and kind is not None and isinstance(case.body, dict) and response.status_code in (200, 422):
        items = case.body["items"]
        bad = [r["index"] for r in response.json()["rejected"]
               # a raw point's field keeps the type the store first saw (state, not schema)
               if not (kind == "points" and all("type conflict" in e for e in r["errors"]))]
        assert all(_item_breaks_rule(kind, items[i]) for i in bad), f"schema-valid items rejected: {response.text}"
        return None
    if _positive(case) and _breaks_rule(case):
        assert response.status_code == 422, f"a request breaking a cross-field rule got {response.status_code}"
        return None
    return positive_data_acceptance(ctx, response, case)


def negative_data_rejected(ctx, response, case):
    """negative_data_rejection, but an ingest batch keeps its good items: 200 with the bad ones rejected."""
    if _ingest_kind(case) is not None and response.status_code == 200 and response.json()["rejected"]:
        return None
    body = case.meta.components.get(ParameterLocation.BODY) if case.meta is not None else None
    if body is None or not body.mode.is_negative:
        # query and header mutations are left out: a repeated scalar query parameter (the last one
        # counts), an empty-named one the HTTP client drops, the Authorization header we add
        return None
    return negative_data_rejection(ctx, response, case)


CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, positive_data_accepted,
          negative_data_rejected, unsupported_method]


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_api_says_what_it_enforces(case):
    case.call_and_validate(headers=auth("admin"), checks=CHECKS)
