"""The Grafana dashboards: schema-valid for Grafana's dashboard model, structurally sound,
wired to the provisioned data source, and the plugin's macro expansion mirrored exactly.
(Every panel's SQL runs against a replayed store in tests/integration/test_dashboards_sql.py.)"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

from tests.paths import REPO, UNIT_TESTDATA
from tools.dev import dashboards as gen
from tools.dev.grafana_sql import (
    ALL_VALUE,
    VARIABLE_RE,
    QueryContext,
    UnknownMacroError,
    Variable,
    apply_conditional_all,
    expand_macros,
    interpolate,
    panel_context,
    replace_variables,
)

SCHEMAS = UNIT_TESTDATA / "grafana-foundation-sdk"
JSON_DIR = REPO / "dashboards" / "json"
PROVISIONING = REPO / "dashboards" / "provisioning"
PANEL_SCHEMA = {
    "timeseries": "timeseries",
    "heatmap": "heatmap",
    "table": "table",
    "stat": "stat",
    "state-timeline": "statetimeline",
}
FILES = sorted(p.name for p in JSON_DIR.glob("*.json"))


def _load(name: str) -> dict[str, Any]:
    model: dict[str, Any] = json.loads((JSON_DIR / name).read_text())
    return model


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    if name == "dashboard":
        _errata(schema["definitions"])
    return schema


def _errata(defs: dict[str, Any]) -> None:
    """Where the SDK's JSON Schema generator renders an ``any`` of Grafana's model as an
    object, use the type the same SDK's Go types give it (go/dashboard/types_gen.go):
    ``MatcherConfig.Options any`` (``byName`` takes a string), ``DynamicConfigValue.Value
    any`` (a unit is a string), ``VariableModel.Query *StringOrMap`` (map[string]any)."""
    assert defs["MatcherConfig"]["properties"]["options"]["type"] == "object"
    defs["MatcherConfig"]["properties"]["options"] = {}
    assert defs["DynamicConfigValue"]["properties"]["value"]["type"] == "object"
    defs["DynamicConfigValue"]["properties"]["value"] = {}
    query = defs["VariableModel"]["properties"]["query"]["oneOf"]
    assert query[1]["additionalProperties"] == {"type": "object", "additionalProperties": {}}
    query[1]["additionalProperties"] = {}


def _errors(validator: Draft7Validator, doc: Any) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def _sub_validator(schema: dict[str, Any], definition: str) -> Draft7Validator:
    """A validator for one ``#/definitions/X`` of a schema (refs resolve inside it)."""
    return Draft7Validator({**schema, "$ref": f"#/definitions/{definition}"})


def test_committed_dashboards_are_the_generated_ones() -> None:
    assert sorted(gen.dashboards()) == FILES
    for name, model in gen.dashboards().items():
        assert (JSON_DIR / name).read_text() == gen.render(model), (
            f"{name} is stale: run python -m tools.dev.dashboards"
        )
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize("name", FILES)
def test_dashboard_is_valid_for_grafanas_dashboard_schema(name: str) -> None:
    model = _load(name)
    schema = _schema("dashboard")
    Draft7Validator.check_schema(schema)
    assert _errors(Draft7Validator(schema), model) == []


def test_the_schema_check_can_fail() -> None:
    model = _load(FILES[0])
    validator = Draft7Validator(_schema("dashboard"))
    broken = json.loads(json.dumps(model))
    broken["panels"][0]["gridPos"]["w"] = "wide"
    broken["templating"]["list"][0]["hide"] = 7
    broken["bogus"] = True
    errors = _errors(validator, broken)
    assert len(errors) >= 3, errors


@pytest.mark.parametrize("name", FILES)
def test_panel_options_are_valid_for_their_panel_type(name: str) -> None:
    for panel in _load(name)["panels"]:
        schema = _schema(PANEL_SCHEMA[panel["type"]])
        where = f"{name} panel {panel['id']} ({panel['type']})"
        assert _errors(_sub_validator(schema, "Options"), panel["options"]) == [], where
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None and "FieldConfig" in schema["definitions"]:
            assert _errors(_sub_validator(schema, "FieldConfig"), custom) == [], where


def _provisioned_datasource() -> dict[str, Any]:
    files = list((PROVISIONING / "datasources").glob("*.yaml"))
    assert len(files) == 1
    doc = yaml.safe_load(files[0].read_text())
    assert doc["apiVersion"] == 1
    (ds,) = doc["datasources"]
    return dict(ds)


def test_provisioning_files() -> None:
    ds = _provisioned_datasource()
    assert ds["type"] == gen.PLUGIN_ID == "grafana-clickhouse-datasource"
    assert ds["uid"] == gen.DATASOURCE_UID
    assert ds["jsonData"]["protocol"] in ("http", "native")
    assert ds["jsonData"]["defaultDatabase"] == "tailguard"
    assert "password" in ds["secureJsonData"]
    files = list((PROVISIONING / "dashboards").glob("*.yaml"))
    assert len(files) == 1
    doc = yaml.safe_load(files[0].read_text())
    assert doc["apiVersion"] == 1
    (provider,) = doc["providers"]
    assert provider["type"] == "file"
    # docker-compose.yml mounts the dashboard JSON where the provider looks.
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./dashboards/json:{provider['options']['path']}:ro" in mounts
    assert "./dashboards/provisioning:/etc/grafana/provisioning:ro" in mounts


def _datasource_refs(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [r for x in node for r in _datasource_refs(x)]
    if not isinstance(node, dict):
        return []
    here = [node["datasource"]] if isinstance(node.get("datasource"), dict) else []
    return here + [r for v in node.values() for r in _datasource_refs(v)]


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [s for x in node for s in _strings(x)]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    return []


def _queries(model: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(where, rawSql, target) of every panel target and query variable."""
    out = [
        (f"panel {p['id']} {p['title']}", t["rawSql"], t)
        for p in model["panels"]
        for t in p["targets"]
    ]
    out += [
        (f"variable {v['name']}", v["query"]["rawSql"], v["query"])
        for v in model["templating"]["list"]
        if v["type"] == "query"
    ]
    return out


@pytest.mark.parametrize("name", FILES)
def test_structure(name: str) -> None:
    model = _load(name)
    panels = model["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert min(g["w"], g["h"]) > 0, p["title"]
        assert min(g["x"], g["y"]) >= 0, p["title"]
        assert g["x"] + g["w"] <= 24, f"{p['title']} is wider than the grid"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps panel {cells[(x, y)]}"
                cells[(x, y)] = p["id"]
        assert p["title"], p["id"]
        assert p["description"], p["id"]
        assert [t["refId"] for t in p["targets"]] == ["A"]
    # Every data source reference is the provisioned ClickHouse data source (or Grafana's own).
    uid = _provisioned_datasource()["uid"]
    for ref in _datasource_refs(model):
        assert ref in (
            {"type": gen.PLUGIN_ID, "uid": uid},
            {"type": "grafana", "uid": "-- Grafana --"},
        ), ref
    # Every variable used is defined, and every variable defined is used.
    defined = {v["name"] for v in model["templating"]["list"]}
    used = set()
    for text in _strings({"panels": panels, "templating": model["templating"]}):
        for m in VARIABLE_RE.finditer(text):
            name = m.group(1) or m.group(2) or m.group(4)
            if not name.startswith("__"):  # $__macros and Grafana's globals
                used.add(name)
    assert used <= defined, used - defined
    assert defined <= used, defined - used
    for where, sql, target in _queries(model):
        assert not re.search(r"--|/\*", sql), f"{where}: no SQL comments"
        if target.get("format") == 0:
            # sqlds converts long frames to wide only when sorted by time.
            assert re.search(r"ORDER BY time(, \w+)?$", sql), where


@pytest.mark.parametrize("name", FILES)
def test_every_query_expands_completely(name: str) -> None:
    model = _load(name)
    variables = {
        v["name"]: Variable(v["name"], [ALL_VALUE] if v.get("multi") else "x", ["a", "b"])
        for v in model["templating"]["list"]
    }
    ctx = QueryContext(1_700_000_000_000, 1_700_003_600_000, 60_000, variables)
    for where, sql, _ in _queries(model):
        out = interpolate(sql, ctx)
        assert not re.search(r"\$|\[\[", out), f"{where}: {out[:200]}"


# --- the expansion mirrors the plugin (test vectors from its pkg/macros/macros_test.go) ----

FROM_MS = 1415792726123  # 2014-11-12T11:45:26.123Z
TO_MS = 1447328726456  # 2015-11-12T11:45:26.456Z
CTX = QueryContext(FROM_MS, TO_MS, 60_000)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (
            "select * from foo where $__timeFilter(cast(sth as timestamp))",
            "select * from foo where cast(sth as timestamp) >= toDateTime(1415792726) AND "
            "cast(sth as timestamp) <= toDateTime(1447328726)",
        ),
        (
            "select * from foo where $__timeFilter(cast(sth as timestamp) )",
            "select * from foo where cast(sth as timestamp) >= toDateTime(1415792726) AND "
            "cast(sth as timestamp) <= toDateTime(1447328726)",
        ),
        (
            "select * from foo where $__timeFilter_ms(cast(sth as timestamp))",
            "select * from foo where cast(sth as timestamp) >= "
            "fromUnixTimestamp64Milli(1415792726123) AND cast(sth as timestamp) <= "
            "fromUnixTimestamp64Milli(1447328726456)",
        ),
        (
            "select * from foo where ( date >= $__fromTime and date <= $__toTime ) limit 100",
            "select * from foo where ( date >= toDateTime(1415792726) and date <= "
            "toDateTime(1447328726) ) limit 100",
        ),
        (
            "select * from foo where ( date >= $__fromTime_ms ) and "
            "( date <= $__toTime_ms ) limit 100",
            "select * from foo where ( date >= fromUnixTimestamp64Milli(1415792726123) ) and "
            "( date <= fromUnixTimestamp64Milli(1447328726456) ) limit 100",
        ),
        (
            "SELECT $__timeInterval($__fromTime) AS from_time",
            "SELECT toStartOfInterval(toDateTime(toDateTime(1415792726)), INTERVAL 60 second) "
            "AS from_time",
        ),
        (
            "SELECT $__timeInterval_ms($__fromTime_ms)",
            "SELECT toStartOfInterval(toDateTime64(fromUnixTimestamp64Milli(1415792726123), 3), "
            "INTERVAL 60000 millisecond)",
        ),
        (
            "select * from foo where $__timeFilter(coalesce(closed_at, $__toTime))",
            "select * from foo where coalesce(closed_at, toDateTime(1447328726)) >= "
            "toDateTime(1415792726) AND coalesce(closed_at, toDateTime(1447328726)) <= "
            "toDateTime(1447328726)",
        ),
        (
            "select * from foo where msg = 'it\\'s -- fine' and $__fromTime",
            "select * from foo where msg = 'it\\'s -- fine' and toDateTime(1415792726)",
        ),
        (
            "select * from foo where msg = 'it''s' and $__fromTime",
            "select * from foo where msg = 'it''s' and toDateTime(1415792726)",
        ),
        (
            "SELECT `it's` AS x, msg FROM t WHERE msg = 'a--b' AND $__timeFilter(ts)",
            "SELECT `it's` AS x, msg FROM t WHERE msg = 'a--b' AND ts >= toDateTime(1415792726) "
            "AND ts <= toDateTime(1447328726)",
        ),
        ("SELECT $__interval_s", "SELECT 60"),
        ("SELECT '$__fromTime'", "SELECT '$__fromTime'"),
    ],
)
def test_macros_expand_like_the_plugin(raw: str, want: str) -> None:
    assert expand_macros(raw, CTX) == want


def test_interval_is_at_least_one_second_and_unknown_macros_fail() -> None:
    assert expand_macros("$__interval_s", QueryContext(0, 1, 200)) == "1"
    assert expand_macros("$__interval_s", QueryContext(0, 1, 90_500)) == "90"
    with pytest.raises(UnknownMacroError):
        expand_macros("SELECT $__timeFilterr(ts)", CTX)


@pytest.mark.parametrize(
    ("time_from", "want_from_ms"),
    [
        (None, 1_000),  # no override: the dashboard's range
        ("", 1_000),
        ("1h", 10_000_000 - 3_600_000),
        ("30m", 10_000_000 - 1_800_000),
        ("90s", 10_000_000 - 90_000),
        ("2d", 10_000_000 - 172_800_000),  # longer than the dashboard's: Grafana's too
        ("1w", 10_000_000 - 604_800_000),
    ],
)
def test_a_panels_relative_time_ends_where_the_dashboards_range_ends(
    time_from: str | None, want_from_ms: int
) -> None:
    ctx = QueryContext(1_000, 10_000_000, 60_000, _vars(model="x"))
    panel = {} if time_from is None else {"timeFrom": time_from}
    got = panel_context(ctx, panel)
    assert (got.from_ms, got.to_ms) == (want_from_ms, 10_000_000)
    assert (got.interval_ms, got.variables) == (ctx.interval_ms, ctx.variables)


@pytest.mark.parametrize("time_from", ["now-1h", "1 h", "h", "1y", "-1h"])
def test_a_relative_time_that_is_not_a_count_and_a_unit_fails(time_from: str) -> None:
    with pytest.raises(ValueError, match="timeFrom"):
        panel_context(CTX, {"timeFrom": time_from})


@pytest.mark.parametrize("name", FILES)
def test_only_the_panels_reading_requests_have_their_own_short_range(name: str) -> None:
    """A panel reading ``requests`` (no rollup: a month of it is 51 M rows, issue 53) shows
    the last hour whatever the dashboard's range, each request's last version in it
    (without ``FINAL`` and without a setting: a read-only session refuses ``SETTINGS``);
    the rollup panels follow the dashboard's range."""
    for p in _load(name)["panels"]:
        (target,) = p["targets"]
        sql = target["rawSql"]
        if re.search(r"\.requests\b", sql) is not None:
            assert p.get("timeFrom") == gen.REQUEST_PANEL_RANGE, p["title"]
            assert sql.count(".requests") == sql.count(gen.LAST_VERSIONS) == 1, p["title"]
            assert not re.search(r"\bFINAL\b|\bSETTINGS\b", sql), p["title"]
            assert gen.REQUEST_PANEL_RANGE in p["description"], p["title"]
        else:
            assert "timeFrom" not in p, p["title"]


def test_the_tenant_variable_lists_the_tenants_of_the_request_panels_range() -> None:
    (tenant,) = [
        v for v in _load("tailguard-latency.json")["templating"]["list"] if v["name"] == "tenant"
    ]
    sql = tenant["query"]["rawSql"]
    assert sql == gen.TENANTS_SQL
    ctx = QueryContext(1_000_000_000_000, 1_000_086_400_000)
    span = panel_context(ctx, {"timeFrom": gen.REQUEST_PANEL_RANGE})
    span_s = (span.to_ms - span.from_ms) // 1000
    want = f"ts >= toDateTime({span.to_ms // 1000}) - INTERVAL {span_s} SECOND AND "
    assert want in interpolate(sql, ctx)


def test_the_panels_reading_requests_are_the_two_per_request_ones() -> None:
    titles = {p["title"] for name in FILES for p in _load(name)["panels"] if "timeFrom" in p}
    assert titles == {
        "Top slow requests with their breakdown",
        "Latency per tenant (exact, from requests)",
    }


def _vars(**current: str | list[str]) -> dict[str, Variable]:
    return {n: Variable(n, c, ["x", "y'z"]) for n, c in current.items()}


@pytest.mark.parametrize(
    ("raw", "variables", "want"),
    [
        # applyConditionalAll (CHDatasource.test.ts cases)
        (
            "select stuff from table where $__conditionalAll(fieldVal in ($fieldVal), $fieldVal);",
            _vars(fieldVal=[ALL_VALUE]),
            "select stuff from table where 1=1;",
        ),
        (
            "select stuff from table where $__conditionalAll(fieldVal in ($fieldVal), $fieldVal);",
            _vars(fieldVal=["x"]),
            "select stuff from table where fieldVal in ($fieldVal);",
        ),
        (
            "where $__conditionalAll(a in ($v), $v) and $__conditionalAll(b in ($w), ${w})",
            _vars(v=[ALL_VALUE], w=""),
            "where 1=1 and 1=1",
        ),
        ("where $__conditionalAll(a in (f(1, 2)), $v)", _vars(v="x"), "where a in (f(1, 2))"),
    ],
)
def test_conditional_all(raw: str, variables: dict[str, Variable], want: str) -> None:
    assert apply_conditional_all(raw, variables) == want


@pytest.mark.parametrize(
    ("raw", "current", "all_value", "want"),
    [
        ("m IN ($v)", ["x", "y'z"], None, "m IN ('x','y'z')"),  # the plugin's format: raw join
        ("m IN (${v:singlequote})", ["x", "y'z"], None, "m IN ('x','y\\'z')"),
        ("m IN (${v:sqlstring})", ["y'z"], None, "m IN ('y''z')"),
        ("m = '${v}'", "x", None, "m = 'x'"),
        ("m = $v AND [[v]]", "x", None, "m = x AND x"),
        ("m IN (${v:singlequote})", [ALL_VALUE], None, "m IN ('x','y\\'z')"),
        ("m IN (${v:singlequote})", ALL_VALUE, ".*", "m IN (.*)"),  # custom all: unformatted
        ("$__timeFilter(ts) AND $unknown", "x", None, "$__timeFilter(ts) AND $unknown"),
    ],
)
def test_template_variables(
    raw: str, current: str | list[str], all_value: str | None, want: str
) -> None:
    variables = {"v": Variable("v", current, ["x", "y'z"], all_value)}
    assert replace_variables(raw, variables) == want


def test_interpolate_runs_the_three_steps_in_order() -> None:
    variables = {
        "db": Variable("db", "tailguard"),
        "model": Variable("model", ["a", "b"], ["a", "b", "c"]),
        "tenant": Variable("tenant", [ALL_VALUE], ["t1"]),
    }
    raw = (
        "SELECT 1 FROM ${db}.r WHERE $__timeFilter(ts) "
        "AND $__conditionalAll(model IN (${model:singlequote}), $model) "
        "AND $__conditionalAll(tenant IN (${tenant:singlequote}), $tenant)"
    )
    got = interpolate(raw, QueryContext(FROM_MS, TO_MS, 60_000, variables))
    assert got == (
        "SELECT 1 FROM tailguard.r WHERE ts >= toDateTime(1415792726) AND "
        "ts <= toDateTime(1447328726) AND model IN ('a','b') AND 1=1"
    )


def test_variable_regex_is_grafanas() -> None:
    found = [m.group(0) for m in VARIABLE_RE.finditer("$a ${b} ${c:singlequote} [[d]] $__e")]
    assert found == ["$a", "${b}", "${c:singlequote}", "[[d]]", "$__e"]
    assert re.fullmatch(r"\w+", "__interval_s")
