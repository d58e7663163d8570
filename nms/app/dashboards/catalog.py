"""The shipped Chronograf dashboards: list, export (names filled in), check, and render queries.

The JSON files beside this module are Chronograf export documents (`{"meta", "dashboard"}`)
whose queries name the database `"__NMS_DATABASE__"` and the raw retention policy
`"__NMS_RP__"`; `export` fills those in, and the `:rp:` template variable's choices (the raw policy
plus each downsampled tier), so the result imports into Chronograf as is.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files

DATABASE, RAW_RP = "__NMS_DATABASE__", "__NMS_RP__"
GRID_COLUMNS = 12
CELL_TYPES = {"line", "line-stacked", "line-stepplot", "line-plus-single-stat", "bar", "single-stat", "gauge",
              "table", "note"}
TEMPLATE_TYPES = {"constant", "csv", "fieldKeys", "tagKeys", "tagValues", "measurements", "databases", "map",
                  "influxql", "text"}
BUILTIN_VARS = {":dashboardTime:", ":upperDashboardTime:", ":interval:"}


def names() -> list[str]:
    return sorted(p.name[:-5] for p in files(__package__).iterdir() if p.name.endswith(".json"))


def load(name: str) -> dict:
    if name not in names():
        raise KeyError(f"no dashboard named {name!r} (shipped: {', '.join(names())})")
    return json.loads(files(__package__).joinpath(f"{name}.json").read_text())


def _ident(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


def _regex_literal(pattern: str) -> str:
    return "/" + pattern.replace("/", "\\/") + "/"


def _fill(value, replacements: dict[str, str]):
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [_fill(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, replacements) for k, v in value.items()}
    return value


def export(name: str, database: str = "nms", raw_rp: str = "autogen", tiers: list[str] | None = None,
           job_hosts: list[str] | None = None, job: str | None = None) -> dict:
    """An importable document: database and retention policies filled in; with `job_hosts` / `job`,
    the job view's variables select that job."""
    doc = _fill(load(name), {f'"{DATABASE}"': f'"{_ident(database)}"', f'"{RAW_RP}"': f'"{_ident(raw_rp)}"',
                             DATABASE: database, RAW_RP: raw_rp})
    for template in doc["dashboard"]["templates"]:
        var = template["tempVar"]
        if var == ":rp:":
            choices = [raw_rp, *(tiers or [])]
            template["values"] = [{"value": f'"{_ident(rp)}"', "type": "csv", "selected": i == 0}
                                  for i, rp in enumerate(choices)]
        elif var == ":job_hosts:" and job_hosts:
            pattern = "^(" + "|".join(re.escape(h) for h in job_hosts) + ")$"
            template["values"] = [{"value": _regex_literal(pattern), "type": "csv", "selected": True}]
        elif var == ":job:" and job:
            template["values"] = [{"value": re.escape(job).replace("/", "\\/"), "type": "csv", "selected": True}]
    doc["meta"].setdefault("nms", {})["database"] = database
    return doc


def queries(doc: dict) -> list[tuple[str, str]]:
    """(cell name, query) of every cell."""
    return [(c["name"], q["query"]) for c in doc["dashboard"]["cells"] for q in c.get("queries", [])]


def render(query: str, values: dict[str, tuple[str, str]]) -> str:
    """A query as Chronograf sends it: `values` maps a variable to (value type, value). Per
    Chronograf's influx/templates.go: tagValue is single-quoted, except inside a /regex/ where it is
    inserted bare; csv/constant/influxql values go in as they are."""
    for var, (kind, value) in values.items():
        if kind in ("tagKey", "fieldKey", "measurement", "tagValue"):
            query = re.sub(
                r"(/[.^/]*)(" + re.escape(var) + r")([.^/]*/)", lambda m, value=value: m[1] + value + m[3], query
            )
        if kind in ("tagKey", "fieldKey", "measurement", "database"):
            query = query.replace(var, f'"{value}"')
        elif kind in ("tagValue", "timeStamp"):
            query = query.replace(var, f"'{value}'")
        else:
            query = query.replace(var, value)
    return query


_SOURCE = re.compile(r'FROM\s+"[^"]*"\.(?:"[^"]*"|:rp:)\."([^"]+)"')
_ALIAS = re.compile(r'AS\s+"([^"]+)"')
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def check(doc: dict, schema: dict) -> list[str]:
    """Why `doc` would not import into Chronograf or would query names nobody writes ([] when fine).
    `schema`: measurement -> object with `tags` and `fields` (nms.app.dashboards.schema.by_name())."""
    problems = []
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("dashboard"), dict):
        return ["not a Chronograf export: needs 'meta' and 'dashboard' objects"]
    dash = doc["dashboard"]
    for key in ("name", "cells", "templates"):
        if key not in dash:
            problems.append(f"dashboard has no {key!r}")
    defined = {t.get("tempVar") for t in dash.get("templates", [])}
    for t in dash.get("templates", []):
        if t.get("type") not in TEMPLATE_TYPES or not re.fullmatch(r":\w+:", t.get("tempVar", "")):
            problems.append(f"template {t.get('tempVar')!r}: bad type {t.get('type')!r} or name")
        if t.get("type") == "tagValues" and not (t.get("query") or {}).get("tagKey"):
            problems.append(f"template {t['tempVar']}: tagValues needs query.tagKey")
    taken: dict[tuple[int, int], str] = {}
    for c in dash.get("cells", []):
        where = f"cell {c.get('name')!r}"
        if any(not isinstance(c.get(k), int) for k in ("x", "y", "w", "h")) or not c.get("name"):
            problems.append(f"{where}: needs a name and integer x, y, w, h")
            continue
        if c["x"] < 0 or c["y"] < 0 or c["w"] < 1 or c["h"] < 1 or c["x"] + c["w"] > GRID_COLUMNS:
            problems.append(f"{where}: outside the {GRID_COLUMNS}-column grid")
        for x in range(c["x"], c["x"] + c["w"]):
            for y in range(c["y"], c["y"] + c["h"]):
                if (x, y) in taken:
                    problems.append(f"{where}: overlaps cell {taken[(x, y)]!r}")
                    break
                taken[(x, y)] = c["name"]
            else:
                continue
            break
        if c.get("type") not in CELL_TYPES:
            problems.append(f"{where}: unknown type {c.get('type')!r}")
        if c.get("type") != "note" and not c.get("queries"):
            problems.append(f"{where}: no queries")
        for q in c.get("queries", []):
            if q.get("type") != "influxql":
                problems.append(f"{where}: query type {q.get('type')!r} is not influxql")
            problems += [f"{where}: {p}" for p in _check_query(q.get("query", ""), schema, defined)]
    return problems


def _check_query(query: str, schema: dict, defined: set) -> list[str]:
    problems = []
    for var in set(re.findall(r":\w+:", query)) - BUILTIN_VARS - defined:
        problems.append(f"variable {var} is not defined by the dashboard")
    sources = _SOURCE.findall(query)
    if not sources:
        return problems + ["no FROM \"database\".\"retention policy\".\"measurement\""]
    known: set[str] = set()
    for measurement in sources:
        m = schema.get(measurement)
        if m is None:
            problems.append(f"measurement {measurement!r} is not in the stored schema")
            continue
        known |= set(m.tags) | set(m.fields)
    # Every quoted name left once the sources and the AS "alias" parts are taken out is a tag or
    # a field (a subquery's outer names are its aliases: ours name them after their fields).
    rest = _ALIAS.sub("", _SOURCE.sub("", query))
    for name in set(_QUOTED.findall(rest)):
        if "*" not in known and name not in known:  # "*": fields that vary (agent_stats)
            problems.append(f"{name!r} is neither a tag nor a field of {', '.join(sorted(set(sources)))}")
    return problems
