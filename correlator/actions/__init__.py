"""The action engine (docs/actions.md): incidents -> actions that change the network, and back.

planner (incident -> proposals, pure), steering (the blast-radius and path-choice core shared with
the host agent and the flow simulator), base (the `Actuator` contract), manager (`ActionManager`:
policy, limits, expiry, rollback, the audit log). The actuators that reach agents and switches are
the application's and are passed in (they need its agent registry and poller); nothing here
imports the application.
"""
