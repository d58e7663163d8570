"""Correlator: windowed join of switch and host telemetry with jobs, fault localization and
classification (findings). `Correlator` (engine.py) is the one entry point the service uses.

Nothing is imported here: the host agent uses `correlator.actions.steering` and must not pay for
the engine (scipy, the whole correlator) on every host."""
