#!/usr/bin/env bash
# Install everything the tests need (Debian packages + the Python package with test extras), then run them.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(influxdb snmpd snmp lldpd iperf3 nftables iproute2 procps)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        echo "== installing Debian packages: ${missing[*]}"
        apt-get update -qq
        # policy-rc.d keeps the packages' own daemons (influxd, snmpd, lldpd) from starting system-wide.
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        rm -f /usr/sbin/policy-rc.d
    else
        echo "== not root: cannot install ${missing[*]}; tests that need them will skip and say why"
    fi
fi

bash scripts/install.sh test
echo "== running tests"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
