"""Parents and children in /incidents (nested by default, flat on request, filters that reach a
child), /incidents/{id}, the OpenAPI schema, and `nms incidents list/show` against a real server."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from correlator.incidents import IncidentManager
from nms.app.cli import app as cli
from nms.app.cli.incidents import _line
from tests.helpers import TOKENS, auth
from tests.test_incidents import T0, W, finding
from tests.test_incidents_api import client, live  # noqa: F401  (fixtures)

LINKS = ["leaf1:swp3--spine1:swp1", "leaf2:swp3--spine1:swp2"]


def switch_death(m: IncidentManager) -> tuple[int, list[int], int]:
    """Two link_down incidents, then spine1's death adopts them; a lone congestion elsewhere."""
    links = [e.incident.id for e in m.apply([finding(element=link, jobs=["train-1"]) for link in LINKS], T0)]
    dead = finding(kind="device_down", element="spine1", element_kind="device",
                   explains=[f"link:{link}" for link in LINKS])
    [parent] = [e.incident.id for e in m.apply([dead], T0 + W) if e.event == "opened"]
    [cong] = [e.incident.id for e in m.apply([dead, finding(kind="congestion", element="leaf3:swp3--spine2:swp3",
                                                            severity="minor")], T0 + 2 * W) if e.event == "opened"]
    return parent, links, cong


def test_list_nests_children_under_their_parent(client):  # noqa: F811
    parent, links, cong = switch_death(client.app.state.service.incidents)
    r = client.get("/incidents", headers=auth("read"))
    assert r.status_code == 200, r.text
    got = r.json()
    assert [i["id"] for i in got] == [cong, parent]
    top = got[1]
    assert (top["kind"], top["element"], top["parent_id"]) == ("device_down", "spine1", None)
    assert sorted(top["children"]) == sorted(links)
    assert [(c["id"], c["parent_id"], c["kind"]) for c in top["child_incidents"]] == [
        (i, parent, "link_down") for i in sorted(links)]
    assert all(c["adopted_ns"] == T0 + W for c in top["child_incidents"])
    assert got[0]["child_incidents"] == []

    def ids(**params):
        return [i["id"] for i in client.get("/incidents", params=params, headers=auth("read")).json()]

    assert ids(element="leaf1") == [parent]  # through its child
    assert ids(kind="link_down") == [parent] and ids(job="train-1") == [parent]
    assert ids(flat=True) == [cong, parent, *sorted(links, reverse=True)]
    assert ids(flat=True, element="leaf1") == [links[0]]
    assert client.get("/incidents", params={"flat": "maybe"}, headers=auth("read")).status_code == 422

    one = client.get(f"/incidents/{parent}", headers=auth("read")).json()
    assert [c["id"] for c in one["child_incidents"]] == sorted(links)
    child = client.get(f"/incidents/{links[0]}", headers=auth("read")).json()
    assert child["parent_id"] == parent and child["child_incidents"] == []
    history = client.get(f"/incidents/{links[0]}/events", headers=auth("read")).json()
    assert [(e["event"], e["incident"]["parent_id"]) for e in history] == [("opened", None), ("updated", parent)]
    opened = client.get(f"/incidents/{parent}/events", headers=auth("read")).json()[0]
    assert opened["event"] == "opened" and sorted(opened["absorbed"]) == sorted(links)


def test_openapi_describes_the_parent_fields(client):  # noqa: F811
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for name in ("parent_id", "children", "explains", "adopted_ns"):
        assert schemas["Incident"]["properties"][name].get("description"), name
    assert schemas["IncidentWithChildren"]["properties"]["child_incidents"]["description"]
    assert schemas["IncidentEventEntry"]["properties"]["absorbed"]["description"]
    listing = spec["paths"]["/incidents"]["get"]
    flat = next(p for p in listing["parameters"] if p["name"] == "flat")
    assert "children" in flat["description"]
    assert listing["responses"]["200"]["content"]["application/json"]["schema"]["items"]["$ref"].endswith(
        "/IncidentWithChildren")


def test_cli_lists_children_under_the_parent_and_shows_them(live):  # noqa: F811
    parent, links, cong = switch_death(live.service.incidents)
    runner = CliRunner(env={"COLUMNS": "250"})

    def nms(*args):
        return runner.invoke(cli, ["incidents", *args, "--url", live.url, "--token", TOKENS["read"]])

    out = nms("list")
    assert out.exit_code == 0, out.output
    rows = [line.split("│")[1].strip() for line in out.output.splitlines() if "│" in line and "open" in line]
    assert rows == [str(cong), str(parent), *[f"└ {i}" for i in sorted(links)]]
    assert "2 incident(s), 2 under them" in out.output
    flat = json.loads(nms("list", "--flat", "--json").stdout)
    assert [i["id"] for i in flat] == [cong, parent, *sorted(links, reverse=True)]

    out = nms("show", str(parent))
    assert out.exit_code == 0, out.output
    assert "children (no notifications of their own)" in out.output
    assert all(link in out.output for link in LINKS) and "explains (2)" in out.output
    out = nms("show", str(links[1]))
    assert f"incident {parent} (this one is explained by it)" in out.output


def test_watch_lines_name_a_childs_parent():
    child = {"id": 12, "severity": "critical", "kind": "link_down", "element": LINKS[0], "summary": "down",
             "parent_id": 11, "acknowledged_by": None}
    assert "link_down" in _line("updated", "40", child) and "(under #11)" in _line("updated", "40", child)
    assert "under" not in _line("opened", "41", {**child, "parent_id": None})
