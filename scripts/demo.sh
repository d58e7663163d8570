#!/usr/bin/env bash
# The main job: install, then run the service on the embedded store and exercise its API end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/nms demo "$@"
