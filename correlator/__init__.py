"""Correlator: windowed join of switch and host telemetry with jobs, fault localization and
classification (findings). `Correlator` (engine.py) is the one entry point the service uses."""

from correlator.engine import Correlator

__all__ = ["Correlator"]
