"""Records: validation and their mapping to store points."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nms.records import Job, PortSample, ProbeWindow
from nms.store.base import declared_fields

T0 = 1_700_000_000 * 10**9


def test_port_sample_to_point_tags_fields_and_time():
    s = PortSample(device="leaf1", port="swp1", ts=T0, in_octets=5, oper_status="up")
    p = s.to_point()
    assert (p.measurement, p.tags, p.ts) == ("port_counters", {"device": "leaf1", "port": "swp1"}, T0)
    assert p.fields == {"in_octets": 5, "oper_status": "up"}  # None fields are left out


def test_counters_keep_every_bit_up_to_2_64_minus_1():
    big = (1 << 64) - 1
    p = PortSample(device="d", port="p", ts=T0, in_octets=big).to_point()
    assert p.fields["in_octets"] == big and type(p.fields["in_octets"]) is int
    assert declared_fields("port_counters")["in_octets"] == "unsigned"
    assert declared_fields("port_counters")["mtu"] == "integer"
    with pytest.raises(ValidationError):
        PortSample(device="d", port="p", ts=T0, in_octets=big + 1)


def test_counter_bits_is_32_or_64_and_32_bit_counters_fit():
    s = PortSample(device="d", port="p", ts=T0, in_octets=(1 << 32) - 1, in_pkts=7, counter_bits=32)
    assert s.to_point().fields["counter_bits"] == 32 and declared_fields("port_counters")["counter_bits"] == "integer"
    assert PortSample(device="d", port="p", ts=T0, in_octets=1 << 40, counter_bits=64).in_octets == 1 << 40
    with pytest.raises(ValidationError, match="above 2\\^32-1"):
        PortSample(device="d", port="p", ts=T0, out_pkts=1 << 32, counter_bits=32)
    for bad in (16, True, "32"):
        with pytest.raises(ValidationError):
            PortSample.model_validate({"device": "d", "port": "p", "ts": T0, "counter_bits": bad})


@pytest.mark.parametrize("ts,expected", [
    (T0, T0), ("2023-11-14T22:13:20Z", T0), ("2023-11-14T22:13:20.000000123+00:00", None), (str(T0), T0)])
def test_timestamps_as_ns_or_rfc3339(ts, expected):
    s = PortSample.model_validate({"device": "d", "port": "p", "ts": ts, "in_octets": 1})
    if expected is not None:
        assert s.ts == expected
    else:  # Python datetimes stop at microseconds: the nanoseconds are truncated, not invented
        assert s.ts == T0


@pytest.mark.parametrize("ts", ["2023-11-14T22:13:20", "yesterday", True, -1, 1 << 63])
def test_bad_timestamps_rejected(ts):
    with pytest.raises(ValidationError):
        PortSample.model_validate({"device": "d", "port": "p", "ts": ts})


def test_strict_types_no_silent_coercion():
    with pytest.raises(ValidationError):
        PortSample.model_validate({"device": "d", "port": "p", "ts": T0, "in_octets": "5"})
    with pytest.raises(ValidationError):
        PortSample.model_validate({"device": "d", "port": "p", "ts": T0, "in_octets": True})


def test_probe_window_consistency_and_loss():
    w = ProbeWindow(src_host="a", src_nic="e0", dst_host="b", dst_nic="e0", path_id="p1", window_start=T0,
                    sent=10, received=7)
    assert w.loss == pytest.approx(0.3)
    assert w.to_point().ts == T0 and w.to_point().tags["path_id"] == "p1"
    with pytest.raises(ValidationError, match="received cannot exceed sent"):
        ProbeWindow(src_host="a", src_nic="e0", dst_host="b", dst_nic="e0", path_id="p1", window_start=T0,
                    sent=1, received=2)


def test_identifiers_reject_control_characters():
    with pytest.raises(ValidationError):
        PortSample(device="leaf\n1", port="p", ts=T0)


def test_job_consistency():
    job = Job(id="j", hosts=["h1"], nics=["h1:mlx5_0"], ranks=[{"rank": 0, "host": "h1"}], start=T0)
    assert job.ranks[0].host == "h1"
    with pytest.raises(ValidationError, match="not listed"):
        Job(id="j", hosts=["h1"], ranks=[{"rank": 0, "host": "h2"}], start=T0)
