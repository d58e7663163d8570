"""Configuration: pydantic models and the YAML loader."""

from nms.config.loader import ConfigError, ConfigIssue, detect_model, load_config, parse_config
from nms.config.models import NmsConfig

__all__ = ["ConfigError", "ConfigIssue", "detect_model", "NmsConfig", "load_config", "parse_config"]
