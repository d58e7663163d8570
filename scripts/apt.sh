#!/usr/bin/env bash
# Install the Debian packages the fabric lab and the tests use, when missing (root only; without root,
# say which are missing: the lab demo falls back to the API-only demo, tests that need them skip and say why).
# Usage: bash scripts/apt.sh PACKAGE...
set -euo pipefail
missing=()
for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "== not root: cannot install ${missing[*]}"
    exit 0
fi
echo "== installing Debian packages: ${missing[*]}"
apt-get update -qq
# policy-rc.d keeps the packages' own daemons (influxd, snmpd, lldpd, sshd) from starting system-wide.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
rm -f /usr/sbin/policy-rc.d
