"""Configuration: pydantic models and the YAML loader."""

from nms.config.loader import ConfigError, ConfigIssue, load_config, parse_config
from nms.config.models import NmsConfig

__all__ = ["ConfigError", "ConfigIssue", "NmsConfig", "load_config", "parse_config"]
