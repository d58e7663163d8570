#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install the package; `install.sh test` adds the test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
extras=""
[ "${1:-}" = "test" ] && extras="[test]"
echo "== installing fabric-nms${extras} into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras}"
.venv/bin/python -c 'import nms, fastapi, duckdb' # fail here, clearly, if the install did not work
