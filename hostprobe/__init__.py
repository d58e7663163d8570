"""Host probe agent (nms-agent): NIC-to-NIC probe mesh over every ECMP path with kernel timestamps,
Paris-traceroute path discovery, per-second windows, path events, NIC counters (docs/hostprobe.md).

Modules: agent (entry point, probe loop), prober, responder, trace, wire, tstamp, stats, clock,
counters, netlink, report, client, transport, config. Clock sync is not built yet.
"""
