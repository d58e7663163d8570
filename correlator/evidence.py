"""Switch-side evidence about an element: oper status, flaps, rates, MTU (what SNMP & co. say).

Reads the context's latest PortSample / LinkEvent / PortRates per port, HostNicSample per NIC and
the topology's per-link view. Everything returns None when nothing is known: absence of switch
data never clears or blames anything by itself.
"""

from __future__ import annotations

from correlator.context import Context
from correlator.fabric import End, FabricIndex
from nms.config.models import Thresholds


class SwitchView:
    def __init__(self, ctx: Context, index: FabricIndex, thresholds: Thresholds):
        self.ctx, self.index, self.t = ctx, index, thresholds

    def oper(self, end: End) -> tuple[str, int] | None:
        """Latest oper status of a port (switch) or NIC (host) and when it was seen."""
        best: tuple[str, int] | None = None
        ps = self.ctx.port_samples.get(end)
        if ps is not None and ps.oper_status is not None:
            best = (ps.oper_status, ps.ts)
        events = self.ctx.link_events.get(end)
        if events and (best is None or events[-1].ts > best[1]):
            best = (events[-1].state, events[-1].ts)
        nic = self.ctx.nic_samples.get(end)
        if nic is not None and nic.oper_status is not None and (best is None or nic.ts > best[1]):
            best = (nic.oper_status, nic.ts)
        return best

    def link_oper(self, lid: int) -> dict[str, str]:
        out = {}
        for end in self.index.links[lid]:
            if (o := self.oper(end)) is not None:
                out[f"{end[0]}:{end[1]}"] = o[0]
        return out

    def link_down(self, lid: int) -> bool:
        """An end reports its port down (or the topology's link state is down)."""
        topo = self.index.topo.get(lid)
        return any(s not in ("up", "unknown", "testing", "dormant") for s in self.link_oper(lid).values()) or (
            topo is not None and topo.state == "down")

    def link_up_after(self, lid: int, ts: int) -> bool:
        """Both ends known and up, seen after `ts`: switch evidence against a down link."""
        opers = [self.oper(end) for end in self.index.links[lid]]
        return all(o is not None and o[0] == "up" and o[1] > ts for o in opers)

    def flaps(self, lid: int) -> int:
        """Down transitions within the flap window, as the switches counted them."""
        best = 0
        for end in self.index.links[lid]:
            events = self.ctx.link_events.get(end)
            if events:
                best = max(best, events[-1].flaps_in_window, sum(e.state != "up" for e in events))
        return best

    def flapping(self, lid: int) -> bool:
        topo = self.index.topo.get(lid)
        if topo is not None and topo.flapping:
            return True
        for end in self.index.links[lid]:
            events = self.ctx.link_events.get(end)
            if events and events[-1].flapping:
                return True
        return self.flaps(lid) >= self.t.flap_count

    def direction_rates(self, did: int) -> dict[str, float]:
        """Egress utilization/discards/errors of the sending end, ingress ones of the receiving end."""
        src, dst = self.index.ends(did)
        out: dict[str, float] = {}
        tx, rx = self.ctx.latest_rates(src), self.ctx.latest_rates(dst)
        if tx is not None:
            for name, value in (("utilization", tx.out_utilization), ("discards_ps", tx.out_discards_ps),
                                ("errors_ps", tx.out_errors_ps)):
                if value is not None:
                    out[name] = round(value, 4)
        if rx is not None:
            if "utilization" not in out and rx.in_utilization is not None:
                out["utilization"] = round(rx.in_utilization, 4)
            if rx.in_errors_ps is not None:
                out["errors_ps"] = round(out.get("errors_ps", 0.0) + rx.in_errors_ps, 4)
            if rx.in_discards_ps is not None:
                out["rx_discards_ps"] = round(rx.in_discards_ps, 4)
        return out

    def congested(self, rates: dict[str, float]) -> bool:
        return rates.get("utilization", 0.0) >= self.t.congestion_utilization or rates.get("discards_ps", 0.0) > 0

    def erroring(self, end: End) -> bool:
        """Input errors in every rate sample of the context (at least two): a sustained trend."""
        q = self.ctx.port_rates.get(end)
        if not q or len(q) < 2:
            return False
        return all((r.in_errors_ps or 0) > 0 for r in q)

    def mtu(self, end: End) -> int | None:
        ps = self.ctx.port_samples.get(end)
        return ps.mtu if ps is not None else None
