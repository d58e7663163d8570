"""The fabric lab: a leaf-spine AI fabric built from network namespaces on one Linux machine.

Modules: topology (plan and addresses), builder (namespaces, links, shaping, management),
routing (static ECMP routes), services (snmpd, lldpd, gNMI target), gnmi_target (+ gnmi_tree,
gnmi_watch: the gNMI server a switch runs), tls (lab CA, switch certificates), faults (+ flap,
the background flapper), traffic (iperf3 load), paths (ECMP path prediction, UDP probes),
inventory (NMS config file), state (lab directory, ground truth JSON), cleanup (teardown),
lab (lifecycle), cli (`nms lab`).
"""
