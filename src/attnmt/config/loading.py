"""Reading a configuration: YAML text (safe loading, never code), ``--set`` overrides, validation
into a :class:`~attnmt.config.schema.Config`, and every validation error as one line naming the
key and, for a file, its line (:func:`key_lines`).

Command-line overrides use dotted keys (``--set model.num_encoder_layers=4``); the value is parsed as
YAML, so ``4`` is an int, ``0.1`` a float, ``true`` a bool and ``null`` None.

Library: PyYAML (parsing) and pydantic (validation).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from attnmt import ranges
from attnmt.config.rules import KeyRuleError
from attnmt.config.schema import Config
from attnmt.errors import ConfigError

# yaml.safe_load's loader, in C (libyaml) where PyYAML was built with it: the same documents, a
# faster start of every command that reads a configuration.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def key_lines(text: str) -> dict[str, int]:
    """The 1-based line of each key of a YAML configuration, by dotted name ('train.lr'); {} where
    the text does not parse."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = f"{prefix}{key.value}"
                lines[name] = key.start_mark.line + 1
                walk(value, name + ".")

    if root is not None:
        walk(root, "")
    return lines


# pydantic's bound of a number field, in words: 'must be at most 10'
_BOUND_WORDS = {"le": "at most", "lt": "below", "ge": "at least", "gt": "above"}


def _out_of_range(e: dict) -> str | None:
    """A number outside its field's range as 'VALUE is out of range: must be at most N', else None."""
    ctx = e.get("ctx") or {}
    value = e["input"] if isinstance(e["input"], str) else repr(e["input"])  # YAML reads 1e6 as a string
    for name, words in _BOUND_WORDS.items():
        if name in ctx and e["type"].startswith(("less_than", "greater_than")):
            return f"{value} is out of range: must be {words} {ranges.number_text(ctx[name])}"
    if e["type"] in ("finite_number", "int_parsing_size"):  # nan, inf; a float too large for an int
        return f"{value} is out of range: must be a finite number"
    return None


def _format_validation_error(err: ValidationError, origin: str, lines: dict[str, int] | None = None) -> str:
    """One line: ``ORIGIN[:LINE]: invalid configuration: key: problem; ...``, LINE being that of the
    first erring key found in the file."""
    parts, where = [], None
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, KeyRuleError):
            key, msg = cause.key, str(cause)
            parts.append(msg)
        else:  # a list entry's index as data.train[2].max_pairs
            key = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in e["loc"]
                          if not (isinstance(x, str) and x.startswith("function-"))).lstrip(".")
            msg = "unknown key" if e["type"] == "extra_forbidden" else (
                _out_of_range(e) or e["msg"].removeprefix("Value error, "))
            parts.append(f"{key}: {msg}" if key else msg)
        found = re.sub(r"\[\d+\].*", "", key)  # key_lines knows mapping keys: data.train for data.train[2].src
        if where is None and lines and (key in lines or found in lines):
            where = lines.get(key, lines.get(found))
    return f"{origin}{f':{where}' if where else ''}: invalid configuration: " + "; ".join(parts)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each ``section.key=value`` override set.

    Raises:
        ConfigError: an override without ``=`` or with an unparsable value.
    """
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. model.num_encoder_layers=4")
        key, value = item.split("=", 1)
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: cannot parse value: {e}") from None
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {p!r} is not a section")
            node = child
        node[parts[-1]] = parsed
    return out


def config_from_dict(raw: dict[str, Any], origin: str = "<config>", *, saved: bool = False,
                     lines: dict[str, int] | Callable[[], dict[str, int]] | None = None) -> Config:
    """Validate a nested dict into a :class:`Config`.

    ``saved``: the configuration a model directory was trained with (its keys are not checked
    against :data:`APPLIES_ONLY_TO`, so that a model trained before a rule still loads).
    ``lines``: the line of each dotted key in the file (:func:`key_lines`), for the message, or
    a function that gives them (called only for a message).

    Raises:
        ConfigError: unknown keys, wrong types or inconsistent values, all named with their key,
            in one line.
    """
    try:
        return Config.model_validate(raw, context={"saved": saved})
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origin, lines() if callable(lines) else lines)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML configuration file, apply dotted overrides, validate.

    Raises:
        ConfigError: missing file, YAML syntax error (with its line), or invalid values.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); is it a YAML configuration?") from None
    return config_from_yaml(text, path, overrides)


def config_from_yaml(text: str, path: str | Path, overrides: list[str] | None = None, *,
                     saved: bool = False) -> Config:
    """Parse YAML text (read from ``path``, named in errors), apply overrides, validate
    (``saved``: as :func:`config_from_dict`).

    Raises:
        ConfigError: YAML syntax error (with its line), not a mapping, or invalid values.
    """
    try:
        raw = yaml.load(text, Loader=SAFE_LOADER) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return config_from_dict(apply_overrides(raw, overrides or []), origin=str(path), saved=saved,
                            lines=lambda: key_lines(text))
