import os

from _influx import influx_store, influxd  # noqa: F401  (influxd fixtures)
from _nats import nats_server  # noqa: F401  (a nats-server with JetStream)
from _notify import notify_make as make  # noqa: F401  (notification test fixtures)
from _notify import notify_rx as rx  # noqa: F401
from _postgres import open_state, postgres_database, postgres_server  # noqa: F401  (state on SQLite and PostgreSQL)
from _snmpd import snmpd  # noqa: F401  (a module-scoped net-snmp snmpd)
from hypothesis import settings

# The property tests draw the same examples on every run (the suite must not fail by chance in CI);
# NMS_HYPOTHESIS=explore draws new ones, to look for counterexamples on purpose.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("NMS_HYPOTHESIS", "repeatable"))
