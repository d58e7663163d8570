from _influx import influx_store, influxd  # noqa: F401
from test_notify_support import notify_make as make  # noqa: F401  (notification test fixtures)
