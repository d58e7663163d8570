#!/usr/bin/env bash
# Install everything the tests need (Debian packages + the Python package with test extras), lint, then test.
# Usage: bash scripts/test.sh [pytest args...]
#   no args: the whole suite in two phases on two pytest-xdist workers: everything but the labs, then the
#   labs (tests/lab/: real-time faults in network namespaces) one at a time on one worker with only
#   tests that have no deadline beside them, at nice 19 (tests/conftest.py)
#   with args: one pytest run with exactly those args
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/apt.sh influxdb nats-server postgresql snmpd snmp lldpd iperf3 nftables iproute2 procps python3-pyverbs openssh-server openssl gcc libc6-dev chromium chromium-driver
bash scripts/install.sh test
echo "== lint (scripts/lint.sh)"
bash scripts/lint.sh
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
# pytest caches the modules it rewrites for assertions (~490, with its plugins') only where bytecode may
# be written: without the cache each of the four collecting workers spends ~20 s rewriting them again
unset PYTHONDONTWRITEBYTECODE
if [ $# -gt 0 ]; then
    echo "== running tests: pytest $*"
    exec "${pytest[@]}" "$@"
fi
echo "== running tests 1/2: all but the labs and the tests that run beside them, on two workers"
rest=0
"${pytest[@]}" -n 2 -m "not lab and not beside_labs" -rR --durations=20 || rest=$?
echo "== running tests 2/2: the labs (tests/lab/) one at a time, beside them the tests with no deadline at nice 19"
labs=0
"${pytest[@]}" -n 2 -m "lab or beside_labs" -rR --durations=30 || labs=$?
echo "== tests: phase 1 exit $rest, phase 2 (the labs) exit $labs"
[ "$rest" -eq 0 ] && [ "$labs" -eq 0 ]
