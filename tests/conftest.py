from _influx import influxd, influx_store  # noqa: F401
from test_notify_support import notify_make as make, notify_rx as rx  # noqa: F401  (notification test fixtures)
