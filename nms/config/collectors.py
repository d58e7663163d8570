"""A switch's `collectors:` section, each entry validated by its collector's own settings model.

`collectors.<name>` names a collector of the `nms.collectors` entry-point group (built in or a third
party's); the collector class declares its settings as `settings_model`, a pydantic model. The
collector is loaded on first use, so the SDK (nms/) imports no collector at module import time.
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import BaseModel, GetCoreSchemaHandler, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

COLLECTOR_GROUP = "nms.collectors"


@functools.cache
def installed_collectors() -> dict[str, EntryPoint]:
    """The installed collectors by name (the entry points are read once per process: a scan costs ~50 ms;
    `installed_collectors.cache_clear()` reads them again)."""
    return {ep.name: ep for ep in entry_points(group=COLLECTOR_GROUP)}


def settings_model(name: str) -> type[BaseModel]:
    """The settings model of the installed collector `name`; ValueError saying why there is none."""
    installed = installed_collectors()
    if name not in installed:
        raise ValueError(f"no collector named {name!r} is installed "
                         f"(installed: {', '.join(sorted(installed)) or 'none'})")
    try:
        collector = installed[name].load()
    except Exception as e:  # a plugin's import may fail in any way; its message names no config value
        raise ValueError(f"the {name} collector could not be loaded ({type(e).__name__}: {e})") from None
    model = getattr(collector, "settings_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ValueError(f"the {name} collector declares no settings model (a pydantic model as its settings_model)")
    return model


def _error(name: str, loc: tuple[int | str, ...], message: str, kind: str = "collector_settings") -> InitErrorDetails:
    """An error at collectors.<name>.<loc>, its message as written (no input: it may be a secret)."""
    return InitErrorDetails(type=PydanticCustomError(kind, message), loc=(name, *loc), input=None)


class CollectorSettings(dict[str, Any]):
    """Settings per collector name, each an instance of that collector's settings model. A collector
    not configured reads as None: `device.collectors.get("snmp")`, or `device.collectors.snmp`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # keep copy/pickle protocols and dunder lookups out of the mapping
            raise AttributeError(name)
        return self.get(name)

    @classmethod
    def _validate(cls, value: dict[str, Any]) -> CollectorSettings:
        settings, errors = cls(), []
        for name, raw in value.items():
            try:
                model = settings_model(name)
            except ValueError as e:
                errors.append(_error(name, (), str(e)))
                continue
            if raw is None:
                continue  # `snmp:` with nothing under it, or null: not polled by it
            try:
                settings[name] = model.model_validate(raw)
            except ValidationError as e:  # each error keeps its path below collectors.<name>
                errors += [_error(name, err["loc"], err["msg"], err["type"])
                           for err in e.errors(include_url=False, include_input=False)]
        if errors:
            raise ValidationError.from_exception_data("collectors", errors)
        return settings

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls._validate, core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
