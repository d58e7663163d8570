"""Acting on incidents: the action manager and its actuators (docs/actions.md)."""
