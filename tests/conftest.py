from _influx import influxd, influx_store  # noqa: F401
