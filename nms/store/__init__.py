"""Telemetry store contract; backends (embedded DuckDB, InfluxDB) are found through the
`nms.stores` entry-point group by the application."""

from nms.store.base import (
    FieldValue,
    Point,
    Query,
    Series,
    StoreError,
    StoreUnavailable,
    TimeSeriesStore,
    WriteResult,
    parse_tag_filters,
    validate_point,
)

__all__ = [
    "FieldValue", "Point", "Query", "Series", "StoreError", "StoreUnavailable",
    "TimeSeriesStore", "WriteResult", "parse_tag_filters", "validate_point",
]
