#!/usr/bin/env bash
# Static checks (configured in pyproject.toml): ruff over the tree; mypy strict on the SDK (nms/ without
# nms/app) and collectors/base.py. Run by scripts/test.sh before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check . && .venv/bin/mypy
