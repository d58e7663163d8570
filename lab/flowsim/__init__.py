"""The flow-level fabric simulator (docs/simulator.md): a fat tree at cluster scale, max-min fair
rates, the LP optimum, and the product's steering core (correlator/actions/steering.py) driving it;
the lab's model of a fabric too big for namespaces (bench/fabric_sim.py, tests/test_fabric_sim.py).

fabric (FatTree, ECMP hashing), maxmin (max-min fair rates, completion time), optimum (the LP
upper bound), control (the controller round by round), planner and colouring (the global path planner:
whole-subflow paths for the whole job at once, issue #26).
"""
