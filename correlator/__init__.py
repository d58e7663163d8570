"""Correlator: windowed join of switch and host telemetry with jobs, fault localization and
classification, action policy. Lands with the correlator issue."""
