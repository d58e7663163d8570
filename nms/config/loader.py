"""Load a YAML config: resolve ${ENV} / ${file:PATH} references, validate, locate errors.

Errors carry the dotted field path and the YAML line, and never the offending value: the value may
be a secret that came from the environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nms.config.models import NmsConfig

_REF_RE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Where a value sits in the config: mapping keys and list indices, from the root down.
ConfigPath = tuple[object, ...]


@dataclass(frozen=True)
class ConfigIssue:
    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.path or '<root>'}: {self.message}"


class ConfigError(Exception):
    def __init__(self, source: str, issues: list[ConfigIssue]):
        self.source = source
        self.issues = issues
        lines = "\n".join(f"  {i}" for i in issues)
        super().__init__(f"{source}: {len(issues)} configuration error(s)\n{lines}")


def _line_index(node: yaml.Node, path: ConfigPath = (), out: dict[ConfigPath, int] | None = None
                ) -> dict[ConfigPath, int]:
    """Map each path (tuple of keys / list indices) to its 1-based YAML line."""
    out = {} if out is None else out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[path + (key,)] = key_node.start_mark.line + 1
            _line_index(value_node, path + (key,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, path + (i,), out)
    return out


def _resolve_refs(value: Any, path: ConfigPath, issues: list[tuple[ConfigPath, str]], base_dir: Path) -> Any:
    if isinstance(value, dict):
        return {k: _resolve_refs(v, path + (k,), issues, base_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_refs(v, path + (i,), issues, base_dir) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref.startswith("file:"):
            file_path = Path(ref[5:]).expanduser()
            if not file_path.is_absolute():
                file_path = base_dir / file_path
            try:
                return file_path.read_text().rstrip("\r\n")
            except OSError as e:
                issues.append((path, f"cannot read secret file {str(file_path)!r}: {e.strerror}"))
                return ""
        name, _, default = ref.partition(":-")
        if not _ENV_NAME_RE.match(name):
            issues.append((path, f"bad reference ${{{ref}}}: use ${{NAME}}, ${{NAME:-default}} or ${{file:PATH}}"))
            return ""
        if name in os.environ:
            return os.environ[name]
        if ":-" in ref:
            return default
        issues.append((path, f"environment variable {name} is not set"))
        return ""

    return _REF_RE.sub(substitute, value)


def _dotted(path: ConfigPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _nearest_line(lines: dict[ConfigPath, int], path: ConfigPath) -> int | None:
    while True:
        if path in lines:
            return lines[path]
        if not path:
            return None
        path = path[:-1]


def parse_config(text: str, source: str = "<config>", base_dir: Path | None = None,
                 model: type[BaseModel] = NmsConfig) -> Any:
    """Parse and validate config text into `model` (default: the service's NmsConfig; the host agent
    passes its own); raise ConfigError listing every problem."""
    base_dir = base_dir or Path.cwd()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(source, [ConfigIssue("", line, f"invalid YAML: {problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [ConfigIssue("", 1, "the top level must be a mapping")])
    lines = _line_index(root) if root is not None else {}

    ref_issues: list[tuple[ConfigPath, str]] = []
    data = _resolve_refs(data, (), ref_issues, base_dir)
    issues = [ConfigIssue(_dotted(p), _nearest_line(lines, p), m) for p, m in ref_issues]
    unresolved = {p for p, _ in ref_issues}
    try:
        config = model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as e:
        for err in e.errors(include_input=False, include_url=False):
            # Drop pydantic's internal union/validator tags from the location.
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-"))))
            # An unresolved reference was reported already; errors it causes at or above it are noise.
            if any(loc and ref[:len(loc)] == loc for ref in unresolved):
                continue
            issues.append(ConfigIssue(_dotted(loc), _nearest_line(lines, loc), err["msg"]))
        config = None
    if issues:
        raise ConfigError(source, issues)
    assert config is not None
    if isinstance(config, NmsConfig) and not config.data_dir.is_absolute():
        config = config.model_copy(update={"data_dir": (base_dir / config.data_dir).resolve()})
    return config


def detect_model(text: str, models: Sequence[type[BaseModel]]) -> type[BaseModel]:
    """Which of `models` a config text is for, by its top-level keys: the model with the most keys among
    the fields no other of them has (a shared key such as log_level tells nothing). The first model on a
    tie, for an empty file, and when the text is not a YAML mapping (parse_config then reports why)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return models[0]
    if not isinstance(root, yaml.MappingNode):
        return models[0]
    keys = {k.value for k, _ in root.value if isinstance(k, yaml.ScalarNode)}
    fields = [set(m.model_fields) for m in models]
    own = [f.difference(*(g for j, g in enumerate(fields) if j != i)) for i, f in enumerate(fields)]
    scores = [len(keys & o) for o in own]
    return models[scores.index(max(scores))]


def load_config(path: str | Path, model: type[BaseModel] = NmsConfig) -> Any:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(str(path), [ConfigIssue("", None, f"cannot read file: {e.strerror}")]) from None
    return parse_config(text, str(path), base_dir=path.resolve().parent, model=model)
