"""Test helpers: a service with one token per scope, built from a real config."""

from __future__ import annotations

from pathlib import Path

import yaml

from nms.config import parse_config

TOKENS = {scope: f"test-token-{scope}-0123456789" for scope in ("read", "ingest", "act", "admin")}


def make_config(data_dir: Path, **overrides):
    api = {"tokens": [{"name": f"t-{scope}", "scopes": [scope], "token": token} for scope, token in TOKENS.items()]}
    api.update(overrides.pop("api", {}))
    doc = {"data_dir": str(data_dir), "api": api, **overrides}
    return parse_config(yaml.safe_dump(doc))


def auth(scope: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[scope]}"}
