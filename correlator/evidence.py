"""Device-side evidence about an element: oper status, flaps, rates, MTU (what SNMP & co. say about
switch ports, and the agents about host NICs).

Reads the context's latest PortSample / LinkEvent / PortRates per port, the egress queues' QueueRates
(drops and ECN marks in the queue: the port is congested, whatever its utilization reads), the last
two HostNicSamples per NIC (error and drop rates) and the topology's per-link view. Everything returns None when
nothing is known: absence of device data never clears or blames anything by itself.
"""

from __future__ import annotations

from correlator.context import Context
from correlator.fabric import End, FabricIndex
from nms.config.models import Thresholds
from nms.counters import counter_delta, per_second

NIC_RATES = {"rx": (("rx_errors", "errors_ps"), ("rx_dropped", "rx_discards_ps")),
             "tx": (("tx_errors", "errors_ps"), ("tx_dropped", "discards_ps"))}


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
        """An end reports its port down, or the topology's link state is down while the ends do not
        both say up (the topology follows LLDP, which sees a healed link seconds after its ports)."""
        topo = self.index.topo.get(lid)
        oper = self.link_oper(lid)
        if any(s not in ("up", "unknown", "testing", "dormant") for s in oper.values()):
            return True
        both_up = len(oper) == 2 and all(s == "up" for s in oper.values())
        return topo is not None and topo.state == "down" and not both_up

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

    def nic_rates(self, end: End, side: str) -> dict[str, float]:
        """Error and drop rates of a host NIC's receive or transmit side, from its last two samples
        (a counter that went back, a driver reload, gives nothing)."""
        cur, prev = self.ctx.nic_samples.get(end), self.ctx.nic_prev.get(end)
        out: dict[str, float] = {}
        if cur is None or prev is None or cur.ts <= prev.ts:
            return out
        for counter, name in NIC_RATES[side]:
            a, b = getattr(prev, counter), getattr(cur, counter)
            if a is not None and b is not None and (delta := counter_delta(a, b, 64)) is not None:
                out[name] = round(per_second(delta, cur.ts - prev.ts), 4)
        return out

    def queues(self, end: End) -> dict[str, dict[str, float]]:
        """The egress queues of a port that dropped or marked within the context: queue -> its latest
        drop and ECN-mark rates, its peak drop rate, and in how many of its rate samples it dropped
        (`of` samples)."""
        out: dict[str, dict[str, float]] = {}
        for name, q in self.ctx.queue_rates.get(end, {}).items():
            dropping = sum((r.dropped_pps or 0) > 0 or (r.ecn_marked_pps or 0) > 0 for r in q)
            if not dropping:
                continue
            last = q[-1]
            entry = {"dropped_pps": round(last.dropped_pps or 0.0, 2),
                     "peak_dropped_pps": round(max(r.dropped_pps or 0.0 for r in q), 2),
                     "samples_dropping": dropping, "of": len(q)}
            if last.ecn_marked_pps is not None:
                entry["ecn_marked_pps"] = round(last.ecn_marked_pps, 2)
            if last.transmit_bps is not None:
                entry["transmit_bps"] = round(last.transmit_bps)
            out[name] = entry
        return out

    def direction_rates(self, did: int) -> dict[str, float]:
        """Egress utilization/discards/errors of the sending end, ingress ones of the receiving end
        (a host NIC's own error and drop counters where an end is a NIC), and the sending end's egress
        queue drops and ECN marks (their latest rates, summed over its queues)."""
        src, dst = self.index.ends(did)
        out: dict[str, float] = {}
        for queue in self.ctx.queue_rates.get(src, {}).values():
            last = queue[-1]
            if last.dropped_pps is not None:
                out["queue_drops_ps"] = round(out.get("queue_drops_ps", 0.0) + last.dropped_pps, 4)
            if last.ecn_marked_pps is not None:
                out["ecn_marks_ps"] = round(out.get("ecn_marks_ps", 0.0) + last.ecn_marked_pps, 4)
        for end, side in ((src, "tx"), (dst, "rx")):
            for name, value in self.nic_rates(end, side).items():
                out[name] = round(out.get(name, 0.0) + value, 4)
        tx, rx = self.ctx.latest_rates(src), self.ctx.latest_rates(dst)
        if tx is not None:
            if tx.out_utilization is not None:
                out["utilization"] = round(tx.out_utilization, 4)
            for name, value in (("discards_ps", tx.out_discards_ps), ("errors_ps", tx.out_errors_ps)):
                if value is not None:
                    out[name] = round(out.get(name, 0.0) + value, 4)
        if rx is not None:
            if "utilization" not in out and rx.in_utilization is not None:
                out["utilization"] = round(rx.in_utilization, 4)
            if rx.in_errors_ps is not None:
                out["errors_ps"] = round(out.get("errors_ps", 0.0) + rx.in_errors_ps, 4)
            if rx.in_discards_ps is not None:
                out["rx_discards_ps"] = round(out.get("rx_discards_ps", 0.0) + rx.in_discards_ps, 4)
        return out

    def congested(self, rates: dict[str, float]) -> bool:
        return (rates.get("utilization", 0.0) >= self.t.congestion_utilization or rates.get("discards_ps", 0.0) > 0
                or self.queueing(rates))

    @staticmethod
    def queueing(rates: dict[str, float]) -> bool:
        """The egress queue drops or ECN-marks: congestion by the switch's own account (a queue overrun
        is not a hardware fault)."""
        return rates.get("queue_drops_ps", 0.0) > 0 or rates.get("ecn_marks_ps", 0.0) > 0

    def queue_congested(self, end: End) -> bool:
        """Drops or marks in every queue rate sample of the context (at least two) of some egress
        queue of the port: sustained congestion, seen by the switch alone."""
        return any(e["samples_dropping"] == e["of"] >= 2 for e in self.queues(end).values())

    def erroring(self, end: End) -> bool:
        """Input errors in every rate sample of the context (at least two): a sustained trend."""
        q = self.ctx.port_rates.get(end)
        if not q or len(q) < 2:
            return False
        return all((r.in_errors_ps or 0) > 0 for r in q)

    def mtu(self, end: End) -> int | None:
        ps = self.ctx.port_samples.get(end)
        return ps.mtu if ps is not None else None
