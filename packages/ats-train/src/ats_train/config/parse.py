"""Loading: a TOML file (tomllib) -> flat {dotted key: value} -> `key=value` overrides applied ->
each value coerced to its field's type -> the typed TrainConfig."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from ats_train.config.choices import choices_of, is_one_of, not_one_of
from ats_train.config.keys import _hint_for, _hints, _section_types
from ats_train.config.train_config import TrainConfig
from ats_train.errors import ConfigError


def _finite(key: str, value: float) -> float:
    """No float knob means anything at inf or nan (None is how a knob says "no limit")."""
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value} is not a finite number")
    return value


def _parse_text(text: str) -> Any:
    """A CLI value as a TOML value (numbers, booleans, arrays, inline tables)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"cannot parse {text!r}") from e
    except RecursionError as e:
        raise ValueError(f"{text[:40]!r}... nests arrays or tables too deeply") from e


def coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a TOML value or a CLI string to the field's type; ConfigError naming key otherwise."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(key, value, arg)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key} = {value!r} is not valid")
    allowed = choices_of(hint)
    if allowed is not None:
        if isinstance(value, str) and all(type(a) is int for a in allowed):
            value = coerce(key, value, int)  # a number from the command line
        if not is_one_of(value, allowed):
            raise not_one_of(key, _shown(value), allowed)
        return value
    expected = getattr(hint, "__name__", str(hint))
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
        elif hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                return int(value.replace("_", ""))
        elif hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return _finite(key, float(value))
            if isinstance(value, str):
                return _finite(key, float(value))
        elif hint is str:
            if isinstance(value, str):
                return value
        elif origin in (tuple, list):
            items = _parse_text(value) if isinstance(value, str) else value
            if isinstance(items, (list, tuple)):
                if origin is tuple and args and args[-1] is not Ellipsis:
                    if len(items) != len(args):
                        raise ConfigError(f"{key} = {value!r}: expected {len(args)} values")
                    return tuple(coerce(key, v, a) for v, a in zip(items, args, strict=True))
                item_hint = args[0] if args else Any
                return origin(coerce(key, v, item_hint) for v in items)
        elif origin is dict or hint is dict:
            table = _parse_text(value) if isinstance(value, str) else value
            if isinstance(table, dict):
                return table
        elif hint is Any:
            return _parse_text(value) if isinstance(value, str) else value
        else:
            return _parse_text(value) if isinstance(value, str) else value
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"{key} = {_shown(value)} is not a valid {expected}") from e
    raise ConfigError(f"{key} = {_shown(value)} is not a valid {expected}")


def _shown(value: Any, limit: int = 80) -> str:
    """A value as the error line shows it: repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_table_field(key: str) -> bool:
    """True when `key` is itself a dict-typed field (its TOML table is one value, not a section)."""
    try:
        hint = _hint_for(key)
    except ConfigError:
        return False
    return hint is dict or typing.get_origin(hint) is dict


def _flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"steps": 3}} -> {"train.steps": 3}; a misspelt table is caught per key later."""
    flat = {}
    for name, value in raw.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and not _is_table_field(key):
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def parse_override(text: str) -> tuple[str, str]:
    """'train.steps=10' -> ('train.steps', '10')."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    return key, value.strip()


def _table(section: type, name: str, table: str, leaves: dict[str, Any]) -> Any:
    """Sub-table `name.table` of `section`: its field's default with `leaves` replaced."""
    (table_field,) = [f for f in dataclasses.fields(section) if f.name == table]
    try:
        return dataclasses.replace(table_field.default_factory(), **leaves)  # type: ignore[misc]
    except ValueError as e:
        message = str(e)
        if message.startswith(f"{name}.{table}."):  # the table's own check names the full key
            raise ConfigError(message) from e
        raise ConfigError(f"{name}.{table}: {message}") from e


def build_config(flat: dict[str, Any]) -> TrainConfig:
    """Typed TrainConfig from {dotted key: value}; values are coerced by each field's type."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _section_types()}
    top: dict[str, Any] = {}
    model_overrides: dict[str, Any] = {}
    for key, value in flat.items():
        hint = _hint_for(key)
        typed = coerce(key, value, hint)
        if "." not in key:
            top[key] = typed
            continue
        section, name = key.split(".", 1)
        if section == "model" and name not in ("preset", "init_from", "add_chat_tokens"):
            model_overrides[name] = typed
        else:
            sections[section][name] = typed
    sections["model"]["overrides"] = model_overrides
    hints = _hints(TrainConfig)
    built = {}
    for name, values in sections.items():
        # a section's sub-tables (orchestrator.<kind>.*, parallel.<backend>.*) are built first,
        # from their leaves over the table's defaults, and passed to the section whole
        nested: dict[str, dict[str, Any]] = {}
        for key in [k for k in values if "." in k]:
            table, leaf = key.split(".", 1)
            nested.setdefault(table, {})[leaf] = values.pop(key)
        for table, leaves in nested.items():
            values[table] = _table(hints[name], name, table, leaves)
        try:
            built[name] = hints[name](**values)
        except ConfigError:
            raise
        except ValueError as e:  # sections defined in their own settings modules
            raise ConfigError(str(e)) from e
    return TrainConfig(**built, **top)


def load_config(
    path: Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> TrainConfig:
    """TOML file (optional) + `key=value` overrides -> validated TrainConfig."""
    flat: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if path.is_dir():
            raise ConfigError(
                f"config file {path} is a directory; pass a TOML file (a run dir's config.toml)"
            )
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = tomllib.loads(path.read_bytes().decode("utf-8"))
            flat.update(_flatten(raw))
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text: {e}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
        except RecursionError as e:
            raise ConfigError(f"config file {path} nests tables or arrays too deeply") from e
    for text in overrides:
        key, value = parse_override(text)
        _hint_for(key)
        flat[key] = value
    return build_config(flat)
