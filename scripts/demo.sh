#!/usr/bin/env bash
# The main job: install (the lab's Debian packages too, as root), then `nms demo`: the fabric lab with
# agents, SNMP collection and the correlator detecting a real link failure (root), or without root the
# API-only demo on the embedded store.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/apt.sh snmpd snmp lldpd iperf3 nftables iproute2 procps gcc libc6-dev
bash scripts/install.sh
exec .venv/bin/nms demo "$@"
