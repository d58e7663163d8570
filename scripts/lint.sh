#!/usr/bin/env bash
# Static checks. mypy: strict on the SDK (nms/ without nms/app) and collectors/base.py,
# from [tool.mypy] in pyproject.toml alone.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/mypy
