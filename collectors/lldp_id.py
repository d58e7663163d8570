"""LLDP chassis and port ids in one form whatever the source: a MAC as lower-case colon hex.

SNMP gives a MAC chassis id as octets (printed `bytes.hex(":")`), lldpd as `08:00:27:b3:fc:e1`,
EOS as `0800.27b3.fce1` (also `800.27b3.fce1`: no leading zeros) or `08:00:27:B3:FC:E1`, NX-OS as
`0800.27b3.fce1`: all become `08:00:27:b3:fc:e1`, so the same neighbour has the same id in every
collector's records. Ids that
are not a MAC (a host name, a network address, a locally assigned string) are kept as given.
"""

from __future__ import annotations

import re

# dotted (Cisco, Arista: EOS leaves out a group's leading zeros, `00c.297b.d2a8`), colon or hyphen pairs
_DOTTED = re.compile(r"([0-9A-Fa-f]{1,4})\.([0-9A-Fa-f]{1,4})\.([0-9A-Fa-f]{1,4})")
_PAIRS = re.compile(r"[0-9A-Fa-f]{1,2}([:-])[0-9A-Fa-f]{1,2}(\1[0-9A-Fa-f]{1,2}){4}")


def mac_or_text(value: str) -> str:
    """`value` as lower-case colon hex when it is a MAC address in a usual notation, else as it is."""
    text = value.strip()
    if (m := _DOTTED.fullmatch(text)) and len(text) >= 12:  # not a short dotted version or name
        digits = "".join(g.zfill(4) for g in m.groups())
    elif _PAIRS.fullmatch(text):
        digits = "".join(g.zfill(2) for g in re.split(r"[:-]", text))
    else:
        return value
    digits = digits.lower()
    return ":".join(digits[i:i + 2] for i in range(0, 12, 2))


def mac_octets(data: bytes) -> str:
    """A MAC given as its octets (LLDP-MIB's ids of subtype macAddress)."""
    return data.hex(":")
