#!/usr/bin/env bash
# Install everything the tests need (Debian packages + the Python package with test extras), lint, then test.
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/apt.sh influxdb nats-server postgresql snmpd snmp lldpd iperf3 nftables iproute2 procps python3-pyverbs openssh-server openssl gcc libc6-dev chromium chromium-driver
bash scripts/install.sh test
echo "== lint (scripts/lint.sh)"
bash scripts/lint.sh
echo "== running tests"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
