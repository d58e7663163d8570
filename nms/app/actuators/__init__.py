"""The actuators of the action engine (correlator/actions/): host_reroute through the agent registry
(host.py), drain_link / isolate_port through the poller's southbound (switch.py), and the registry
that builds them for the Service. They live in the application because they use its parts."""
