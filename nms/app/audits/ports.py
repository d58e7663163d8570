"""Per-cable port checks: MTU consistency, speed/duplex agreement, error-counter hygiene (BER).

Each cable of the reconciled topology that is physically there (every check but `missing`) is
judged from the latest port samples and rates of its polled ends; a host end by the MTU and speed
its agent reports for the NIC (`Snapshot.host_nics`), else the host link is judged by its switch end
alone."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from nms.app.audits.model import AuditFinding, AuditResult, End, Snapshot, result
from nms.config.models import ErrorsAudit, MtuAudit, SpeedAudit
from nms.records import TopologyLink
from nms.topology import parse_end


def present_links(snap: Snapshot) -> Iterator[tuple[TopologyLink, End, End]]:
    for link in snap.topology.links if snap.topology else ():
        if link.check != "missing":
            yield link, parse_end(link.a), parse_end(link.b)


def _element(link: TopologyLink) -> str:
    return f"{link.a}--{link.b}"


def check_mtu(snap: Snapshot, settings: MtuAudit) -> AuditResult:
    name = "mtu"
    mtus = {end: s.mtu for end, s in snap.samples.items() if s.mtu is not None}
    mtus |= {end: v["mtu"] for end, v in snap.host_nics.items() if "mtu" in v}
    links = [(link, a, b) for link, a, b in present_links(snap) if a in mtus or b in mtus]
    if not links:
        return result(name, [], 0, no_data="no MTU of any cabled port is known (no port samples with ifMtu)")
    common = settings.expected_mtu or Counter(mtus[e] for _, a, b in links for e in (a, b)
                                              if e in mtus).most_common(1)[0][0]
    findings = []
    for link, a, b in links:
        ends = {f"{e[0]}:{e[1]}": mtus[e] for e in (a, b) if e in mtus}
        values = set(ends.values())
        evidence = {"mtu": ends, "fabric_mtu": common}
        if len(values) > 1:
            low = min(values)
            findings.append(AuditFinding(
                audit=name, severity="major", element=_element(link), element_kind="link", evidence=evidence,
                message=f"MTU differs across the cable: {', '.join(f'{k} {v}' for k, v in ends.items())}; "
                        f"frames above {low} bytes are dropped one way",
                remediation=f"Set both ends to the fabric MTU {common}."))
        elif min(values) < common:
            findings.append(AuditFinding(
                audit=name, severity="major", element=_element(link), element_kind="link", evidence=evidence,
                message=f"MTU {min(values)} is below the fabric's {common}: every path across this cable "
                        f"drops frames above {min(values)} bytes end to end",
                remediation=f"Set the ports of this cable to {common}."))
    host_names = {h.name for h in snap.fabric.hosts}
    unknown = sorted({f"{e[0]}:{e[1]}" for _, a, b in links for e in (a, b) if e[0] in host_names and e not in mtus})
    notes = [f"no agent reports the MTU of {len(unknown)} host NIC(s) (e.g. {unknown[0]}): "
             "those host links are judged by their switch port"] if unknown else []
    return result(name, findings, len(links), notes)


def check_speed(snap: Snapshot, settings: SpeedAudit) -> AuditResult:
    name = "speed"
    speeds = {end: s.speed_bps for end, s in snap.samples.items() if s.speed_bps}
    speeds |= {end: v["speed_bps"] for end, v in snap.host_nics.items() if "speed_bps" in v}
    links = [(link, a, b) for link, a, b in present_links(snap) if a in speeds and b in speeds]
    notes = ["duplex: no collector reports duplex; only speeds are compared"]
    if not links:
        return result(name, [], 0, notes, no_data="no cable has a known speed on both ends")
    findings = []
    for link, a, b in links:
        if speeds[a] != speeds[b]:
            ends = {f"{e[0]}:{e[1]}": speeds[e] for e in (a, b)}
            findings.append(
                AuditFinding(
                    audit=name,
                    severity="major",
                    element=_element(link),
                    element_kind="link",
                    evidence={"speed_bps": ends},
                    message="speed differs across the cable: "
                    + ", ".join(f"{k} {v / 1e9:g} Gb/s" for k, v in ends.items()),
                    remediation="Check auto-negotiation and the optics on both ends; force both ports to the "
                    "speed the cable is rated for.",
                )
            )
    return result(name, findings, len(links), notes)


def check_errors(snap: Snapshot, settings: ErrorsAudit) -> AuditResult:
    """Receive errors per line-rate bit (as ibdiagnet's BER: errors / (speed x time)) of each cabled
    port; plus cables the probe mesh localizes as lossy while their counters stay clean."""
    name = "errors"
    findings: dict[str, AuditFinding] = {}
    checked = 0
    for link, a, b in present_links(snap):
        for end in (a, b):
            rates = snap.rates.get(end)
            if rates is None or rates.in_errors_ps is None:
                continue
            sample = snap.samples.get(end)
            bits_ps = (sample.speed_bps if sample and sample.speed_bps else None) or rates.in_bps
            if not bits_ps:
                continue
            checked += 1
            ber = rates.in_errors_ps / bits_ps
            held = findings.get(_element(link))
            if ber <= settings.ber_threshold or (held and held.evidence["ber"] >= ber):
                continue
            findings[_element(link)] = AuditFinding(
                audit=name, severity="major", element=_element(link), element_kind="link",
                evidence={"port": f"{end[0]}:{end[1]}", "ber": ber, "in_errors_ps": rates.in_errors_ps,
                          "out_errors_ps": rates.out_errors_ps, "bits_ps": bits_ps,
                          "ber_threshold": settings.ber_threshold},
                message=f"{end[0]}:{end[1]} receives {rates.in_errors_ps:.3g} errored frames/s: BER "
                        f"{ber:.2e} above {settings.ber_threshold:.0e}",
                remediation="Clean or reseat the connectors, then replace the optic or cable on this link "
                            "(the receiving port names the suspect direction).")
    for element, loss in sorted((snap.lossy_links or {}).items()):
        checked += 1
        if element in findings:
            continue
        pct = loss.get("loss_pct")
        findings[element] = AuditFinding(
            # the correlator's own incident tracks this loss; standing until the next run (an hour), a copy
            # would hold the incident open long after a transient loss (a fault's first window) is gone
            audit=name, severity="major", element=element, element_kind="link", evidence={"probe": loss},
            escalates=False,
            message=f"probes lose {pct:.2g}% across this link while its error counters stay clean: silent "
                    f"corruption or a filtering device" if pct is not None else
                    "probes lose frames across this link while its error counters stay clean",
            remediation="Replace the optic or cable (a drop counters do not show); check for ACLs or policers "
                        "on both ports.")
    notes = [] if snap.lossy_links is not None else ["probe loss per link unknown (correlator disabled)"]
    return result(name, list(findings.values()), checked, notes,
                  no_data=None if checked else "no cabled port has error-counter rates yet (two polls needed)")
