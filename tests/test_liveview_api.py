"""The live view's server side without a browser: login/logout and the session cookie (scopes,
Origin, expiry, where the cookie is and is not accepted), the security headers of every /ui
response, the assets (no inline script or style), and /fabric/stream's format on a real uvicorn
server (events, ids, utilization, state changes within a tick, resume with Last-Event-ID).
The browser and the lab: tests/lab/test_liveview_lab.py."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from nms.app import auth as auth_module
from nms.app.api import create_app, fabric_view
from nms.app.api.ui import CSP, WEB
from nms.app.auth import Principal, SessionStore
from nms.app.service import Service
from nms.records import FabricTopology, Job, LinkEvent, PortRates, TopologyLink, TopologyNode
from tests.helpers import TOKENS, auth, make_config, serve_in_thread

ORIGIN = "http://testserver"
L1 = "leaf1:swp1--spine1:swp1"
L2 = "leaf1:swp2--spine2:swp1"


def config(tmp_path, **api):
    return make_config(tmp_path, api=api, polling={"enabled": False})


@pytest.fixture
def client(tmp_path):
    # no lifespan: the service is not running, so streams end after their first events
    return TestClient(create_app(Service(config(tmp_path))))


def login(c, scope="read", origin=ORIGIN):
    return c.post("/ui/session", json={"token": TOKENS[scope]}, headers={"Origin": origin} if origin else {})


# --- sessions ---------------------------------------------------------------------------------------


def test_login_sets_a_strict_httponly_cookie_holding_no_token(client):
    r = login(client)
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "t-read", "scopes": ["read"], "expires_in_s": 8 * 3600.0}
    cookie = r.headers["set-cookie"]
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "path", "max-age", "samesite"} <= attrs and "secure" not in attrs  # plain HTTP
    assert "samesite=strict" in cookie.lower() and "max-age=28800" in cookie.lower()
    session_id = client.cookies["nms_session"]
    assert len(session_id) >= 40 and TOKENS["read"] not in cookie
    assert client.get("/ui/session").json()["name"] == "t-read"
    page = client.get("/ui/", follow_redirects=False)
    assert page.status_code == 200 and 'src="/ui/static/view.js"' in page.text


def test_secure_cookie_over_tls(tmp_path):
    c = TestClient(create_app(Service(config(tmp_path))), base_url="https://testserver")
    r = login(c, origin="https://testserver")
    assert r.status_code == 200 and "; secure" in r.headers["set-cookie"].lower()
    assert login(c, origin=ORIGIN).status_code == 403  # http:// is another origin


def test_login_refusals_name_the_reason_and_never_echo_the_token(client):
    assert login(client, "ingest").status_code == 403
    assert "lacks scope 'read'" in login(client, "ingest").json()["detail"]
    assert login(client, "admin").status_code == 200  # admin implies read
    client.cookies.clear()
    bad = client.post("/ui/session", json={"token": "not-a-token"}, headers={"Origin": ORIGIN})
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    for body in ({"token": TOKENS["read"], "extra": 1}, {"tok": TOKENS["read"]}, [TOKENS["read"]],
                 {"token": TOKENS["read"] * 200}):
        r = client.post("/ui/session", json=body, headers={"Origin": ORIGIN})
        assert r.status_code == 400 and TOKENS["read"] not in r.text, (body, r.text)
    r = client.post("/ui/session", content=b"token=" + TOKENS["read"].encode(), headers={"Origin": ORIGIN})
    assert r.status_code == 400 and TOKENS["read"] not in r.text
    metrics = client.get("/metrics", headers=auth("read")).text
    assert re.search(r'nms_auth_failures_total\{reason="scope"\} 2', metrics)


@pytest.mark.parametrize("origin", [None, "http://evil.example", "https://testserver", "null"])
def test_login_and_logout_check_origin(client, origin):
    r = login(client, origin=origin)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    assert login(client).status_code == 200
    out = client.delete("/ui/session", headers={"Origin": origin} if origin else {})
    assert out.status_code == 403
    assert client.get("/ui/session").status_code == 200  # still logged in


def test_logout_deletes_the_session_server_side(client):
    login(client)
    session_id = client.cookies["nms_session"]
    r = client.delete("/ui/session", headers={"Origin": ORIGIN})
    assert r.status_code == 204 and 'nms_session=""' in r.headers["set-cookie"]
    client.cookies.set("nms_session", session_id)  # a copy of the cookie kept somewhere
    assert client.get("/ui/session").status_code == 401
    assert client.get("/fabric/stream").status_code == 401
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"


def test_the_cookie_opens_only_the_views_routes(client):
    """An admin's session reads the page, the streams and one incident (the details panel), and
    nothing else: not the rest of the JSON API, not ingest, not act."""
    assert login(client, "admin").status_code == 200
    for path in ("/ui/session", "/fabric/stream", "/incidents/stream"):
        assert client.get(path).status_code == 200, path
    for method, path, body in (("GET", "/topology", None), ("GET", "/jobs", None), ("GET", "/incidents", None),
                               ("POST", "/jobs", {"id": "j", "start": 1}), ("POST", "/incidents/1/ack", {}),
                               ("POST", "/ingest/port_samples", {"samples": []}), ("GET", "/agents", None),
                               ("POST", "/audits/run", {})):
        r = client.request(method, path, json=body, headers={"Origin": ORIGIN})
        assert r.status_code == 401, (method, path, r.status_code, r.text)
    # the details panel re-reads the incidents it shows: one incident, read only
    assert client.get("/incidents/424242").status_code == 404  # past the cookie check: no such incident
    # a bearer token still works on the streams (the CLI and scripts), and its scope is checked
    client.cookies.clear()
    assert client.get("/fabric/stream", headers=auth("read")).status_code == 200
    assert client.get("/fabric/stream", headers=auth("ingest")).status_code == 403
    assert client.get("/fabric/stream").status_code == 401


def test_sessions_expire_and_are_bounded(client, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(auth_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    store = SessionStore(ttl_s=60, limit=2)
    who = Principal("p", frozenset({"read"}))
    first, second = store.create(who), store.create(who)
    assert store.lookup(first) == who and store.lookup("nope") is None
    third = store.create(who)  # over the limit: the oldest goes
    assert store.lookup(first) is None and store.lookup(second) == who and len(store) == 2
    now[0] += 60
    assert store.lookup(third) is None and len(store) == 0
    # through the app: api.session_ttl
    assert login(client).status_code == 200
    now[0] += 8 * 3600 - 1
    assert client.get("/ui/session").status_code == 200
    now[0] += 1
    assert client.get("/ui/session").status_code == 401
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_session_ttl_is_configured(tmp_path):
    c = TestClient(create_app(Service(config(tmp_path, session_ttl="15m"))))
    assert login(c).json()["expires_in_s"] == 900 and "max-age=900" in login(c).headers["set-cookie"].lower()


# --- headers and assets ----------------------------------------------------------------------------


def test_every_ui_response_carries_the_strict_headers(client):
    login(client)
    responses = [client.get(p, follow_redirects=False) for p in
                 ("/ui", "/ui/", "/ui/login", "/ui/static/view.js", "/ui/static/view.css", "/ui/static/nope.js",
                  "/ui/static/..%2Fapi%2Fui.py", "/ui/session")]
    client.cookies.clear()
    responses.append(client.get("/ui/", follow_redirects=False))
    assert [r.status_code for r in responses] == [308, 200, 200, 200, 200, 404, 404, 200, 303]
    for r in responses:
        assert r.headers["content-security-policy"] == CSP, r.url
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert CSP == ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                   "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
    assert responses[3].headers["content-type"].startswith("text/javascript")
    assert responses[4].headers["content-type"].startswith("text/css")
    assert responses[1].headers["cache-control"] == "no-store"
    assert "content-security-policy" not in client.get("/health").headers  # only the UI's routes


def test_assets_have_no_inline_script_or_style_and_every_import_resolves():
    pages = sorted(WEB.glob("*.html"))
    scripts = sorted(WEB.glob("*.js"))
    assert {p.name for p in pages} == {"fabric.html", "login.html"} and len(scripts) >= 5
    for page in pages:
        text = page.read_text()
        assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", text) == [], page.name
        assert "<style" not in text and not re.search(r"\sstyle\s*=", text), page.name
        assert not re.search(r"\son[a-z]+\s*=", text), page.name  # no inline event handlers
        for ref in re.findall(r'(?:src|href)="/ui/static/([^"]+)"', text):
            assert (WEB / ref).is_file(), ref
    for script in scripts:
        text = script.read_text()
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "new Function", ".style.",
                       "setAttribute(\"style\"", "document.write", "localStorage", "sessionStorage"):
            assert banned not in text, (script.name, banned)
        for ref in re.findall(r'from "\./([^"]+)"', text):
            assert (WEB / ref).is_file(), (script.name, ref)
    assert "/ui/static/" not in (WEB / "view.css").read_text()


def test_the_assets_are_package_data():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '"nms.app.web" = ["*.html", "*.js", "*.css"]' in pyproject
    assert (WEB / "__init__.py").is_file()


# --- /fabric/stream --------------------------------------------------------------------------------


def _topology(state_l1="up", check_l2="ok") -> FabricTopology:
    nodes = [TopologyNode(name=n, kind="switch", role=r, configured=True, reachable=True)
             for n, r in (("spine1", "spine"), ("spine2", "spine"), ("leaf1", "leaf"))]
    nodes.append(TopologyNode(name="h1", kind="host", role="host", configured=True))
    links = [TopologyLink(a="leaf1:swp1", b="spine1:swp1", check="ok", state=state_l1),
             TopologyLink(a="leaf1:swp2", b="spine2:swp1", check=check_l2, state="up")]
    return FabricTopology(nodes=nodes, links=links, generated_ns=time.time_ns())


def _rates(device, port, **kw) -> PortRates:
    return PortRates(device=device, port=port, ts=time.time_ns(), interval_s=1.0, **kw)


def test_views_tiers_utilization_and_direction():
    topo, links = fabric_view.views_of(_topology(), {
        ("leaf1", "swp1"): _rates("leaf1", "swp1", in_bps=2e6, out_bps=9e6, in_utilization=0.02, out_utilization=0.09),
        ("spine2", "swp1"): _rates("spine2", "swp1", in_bps=4e6, out_bps=1e6, in_utilization=0.04,
                                   out_utilization=0.61)})
    assert {n.name: n.tier for n in topo.nodes} == {"spine1": 1, "spine2": 1, "leaf1": 2, "h1": 3}
    assert [lk.id for lk in topo.links] == [L1, L2]
    one, two = links.links[L1], links.links[L2]
    assert (one.utilization, one.bps_ab, one.bps_ba) == (0.09, 9e6, 2e6)  # a = leaf1 end polled
    assert (two.utilization, two.bps_ab, two.bps_ba) == (0.61, 4e6, 1e6)  # only b (spine2) polled: mirrored
    _, bare = fabric_view.views_of(_topology(), {})
    assert bare.links[L1].utilization is None and bare.links[L1].bps_ab is None


class Stream:
    """Reads /fabric/stream in a thread: events as dicts of their fields, comments as str, None at
    the end."""

    def __init__(self, url: str, headers: dict):
        self.items: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(url, headers), daemon=True)
        self.thread.start()

    def _run(self, url, headers):
        try:
            with httpx.stream("GET", f"{url}/fabric/stream", headers=headers, timeout=httpx.Timeout(5, read=30)) as r:
                self.status, self.headers = r.status_code, r.headers
                fields: dict = {}
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return
                    if line.startswith(":"):
                        self.items.put(line)
                    elif line:
                        name, _, value = line.partition(": ")
                        fields[name] = value
                    elif fields:
                        self.items.put(fields)
                        fields = {}
        finally:
            self.items.put(None)

    def next_event(self, name: str | None = None, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            item = self.items.get(timeout=max(0.01, deadline - time.monotonic()))
            assert item is not None, "the stream ended"
            if isinstance(item, dict) and (name is None or item["event"] == name):
                return item


@pytest.fixture
def live(tmp_path):
    service = Service(config(tmp_path))
    holder = {"topology": _topology()}
    service.poller.topology = lambda: holder["topology"].model_copy(update={"generated_ns": time.time_ns()})
    app = create_app(service)
    url, server, thread = serve_in_thread(app)
    yield SimpleNamespace(url=url, service=service, holder=holder)
    server.should_exit = True
    thread.join(20)
    assert not thread.is_alive(), "the server did not stop (a stream kept it up?)"


def test_stream_format_ticks_changes_and_resume(live):
    recent = live.service.poller.recent
    recent.rates[("leaf1", "swp1")] = _rates("leaf1", "swp1", out_bps=5e7, out_utilization=0.5, in_utilization=0.1)
    live.service.state.put_job(Job(id="train-1", hosts=["h1"], start=time.time_ns() - 10**9))
    s = Stream(live.url, auth("read"))
    first = s.items.get(timeout=10)
    assert first == ": fabric links" and s.status == 200 and s.headers["content-type"].startswith("text/event-stream")
    assert s.next_event() == {"retry": str(fabric_view.RETRY_MS)}  # the browser reconnects after a second
    topo = s.next_event()
    assert topo["event"] == "topology" and "id" not in topo
    assert [lk["id"] for lk in json.loads(topo["data"])["links"]] == [L1, L2]
    jobs = s.next_event()
    assert jobs["event"] == "jobs" and [j["id"] for j in json.loads(jobs["data"])["jobs"]] == ["train-1"]
    ticks = [s.next_event("links") for _ in range(3)]
    ids = [int(t["id"]) for t in ticks]
    assert ids == sorted(ids) and len(set(ids)) == 3
    gaps = [(b - a) / 1e9 for a, b in zip(ids, ids[1:])]
    assert all(0.9 <= g <= 1.6 for g in gaps), gaps  # every second while nothing changes
    status = json.loads(ticks[-1]["data"])["links"]
    assert status[L1]["utilization"] == 0.5 and status[L1]["bps_ab"] == 5e7 and status[L1]["state"] == "up"

    # a link going down is sent within a check, not at the next tick
    live.holder["topology"] = _topology(state_l1="down", check_l2="missing")
    changed_at = time.time_ns()
    recent.events.append(LinkEvent(device="leaf1", port="swp1", ts=changed_at, state="down", previous="up"))
    change = s.next_event("link_event", timeout=3)
    assert json.loads(change["data"])["state"] == "down" and "id" not in change
    down = s.next_event("links", timeout=3)
    assert (int(down["id"]) - changed_at) / 1e9 < 0.6
    status = json.loads(down["data"])["links"]
    assert status[L1]["state"] == "down" and status[L2]["check"] == "missing"

    # the topology changing (a cable gone) is a new topology event
    live.holder["topology"] = FabricTopology(nodes=_topology().nodes, links=_topology().links[:1], generated_ns=1)
    assert [lk["id"] for lk in json.loads(s.next_event("topology", timeout=3)["data"])["links"]] == [L1]
    s.stop.set()

    # resuming: the link changes after Last-Event-ID come first, then the whole state again
    again = Stream(live.url, {**auth("read"), "Last-Event-ID": str(changed_at - 1)})
    assert again.items.get(timeout=10) == ": fabric links"
    assert "retry" in again.next_event()
    missed = again.next_event()
    assert missed["event"] == "link_event" and json.loads(missed["data"])["ts"] == changed_at
    assert [again.next_event()["event"] for _ in range(3)] == ["topology", "jobs", "links"]
    again.stop.set()
    late = Stream(live.url, {**auth("read"), "Last-Event-ID": str(changed_at)})
    late.items.get(timeout=10)
    assert "retry" in late.next_event()
    assert late.next_event()["event"] == "topology"  # nothing missed after that id
    late.stop.set()
    bad = httpx.get(f"{live.url}/fabric/stream", headers={**auth("read"), "Last-Event-ID": "yesterday"})
    assert bad.status_code == 422


def test_stream_retry_field_and_unauthenticated(live):
    with httpx.stream("GET", f"{live.url}/fabric/stream", headers=auth("read"), timeout=10) as r:
        assert next(r.iter_lines()) == f"retry: {fabric_view.RETRY_MS}"
        assert r.headers["cache-control"] == "no-cache"
    assert httpx.get(f"{live.url}/fabric/stream").status_code == 401
    assert httpx.get(f"{live.url}/fabric/stream", headers=auth("ingest")).status_code == 403
