"""A small leaf-spine fabric for the action tests: hosts h1,h2 under leaf1 and h3,h4 under leaf2,
`spines` spines, every switch port with an address (as the lab numbers them)."""

from __future__ import annotations

from nms.records import FabricTopology, Incident, InterfaceAddress, TopologyLink, TopologyNode

HOSTS = {"h1": "leaf1", "h2": "leaf1", "h3": "leaf2", "h4": "leaf2"}


def uplink(leaf: str, spine: int) -> str:
    """The element name of leaf<->spine<n> (sorted ends)."""
    a, b = f"{leaf}:up{spine}", f"spine{spine}:{leaf}"
    return "--".join(sorted((a, b)))


def topology(spines: int = 2) -> FabricTopology:
    nodes = [TopologyNode(name=f"spine{i}", kind="switch", role="spine", configured=True) for i in range(1, spines + 1)]
    nodes += [TopologyNode(name=n, kind="switch", role="leaf", configured=True) for n in ("leaf1", "leaf2")]
    nodes += [TopologyNode(name=h, kind="host", configured=True) for h in HOSTS]
    links = [TopologyLink(a=f"{h}:eth0", b=f"{leaf}:{h}", check="ok", state="up") for h, leaf in HOSTS.items()]
    for leaf in ("leaf1", "leaf2"):
        for i in range(1, spines + 1):
            a, b = sorted((f"{leaf}:up{i}", f"spine{i}:{leaf}"))
            links.append(TopologyLink(a=a, b=b, check="ok", state="up"))
    return FabricTopology(nodes=nodes, links=links, generated_ns=1)


def addresses(spines: int = 2) -> list[InterfaceAddress]:
    out = []
    for li, leaf in enumerate(("leaf1", "leaf2"), 1):
        for i in range(1, spines + 1):
            out.append(InterfaceAddress(device=leaf, port=f"up{i}", ts=1, address=f"10.{li}.{i}.1", prefix_len=31))
            out.append(InterfaceAddress(device=f"spine{i}", port=leaf, ts=1, address=f"10.{li}.{i}.0", prefix_len=31))
    return out


def incident(kind: str = "congestion", element: str | None = None, pairs=(("h1", "h3"), ("h3", "h1")),
             iid: int = 7, **kw) -> Incident:
    element = element or uplink("leaf1", 1)
    paths = [f"{s}:eth0>{d}:eth0/{n}" for s, d in pairs for n in range(2)]
    base = dict(id=iid, dedup_key=f"link:{element}", kind=kind, element=element, element_kind="link",
                severity="major", summary=f"{kind} on {element}", confidence=0.9, paths=paths,
                opened_ns=1, updated_ns=1, last_seen_ns=1)
    return Incident(**(base | kw))
