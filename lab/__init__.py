"""The fabric lab: a leaf-spine AI fabric built from network namespaces on one Linux machine.

Modules: topology (plan and addresses), builder (namespaces, links, shaping, management),
routing (static ECMP routes), services (snmpd, lldpd, gNMI target), gnmi_target (+ gnmi_tree,
gnmi_watch, gnmi_set, gnmi_qos, gnmi_system: the gNMI server a switch runs), tls (lab CA, switch
certificates), faults (+ flap, the background flapper), traffic (iperf3 load), jobtraffic and
allreduce (job traffic), paths (ECMP path prediction, UDP probes), inventory (NMS config file),
state (lab directory, ground truth JSON), cleanup (teardown), lab (lifecycle), cli (`nms lab`),
agent_procs (an agent per host), stack (lab + `nms serve` + agents), mesh (the stack with query
helpers), correlator_trials and control_trials (fault and act-loop trials shared by tests and
benches), flowsim/ (the flow-level simulator of a cluster-scale fat tree).

The lab sits above everything (it runs the service, the agents and the NCCL plugin); nothing in
the SDK imports it.
"""
