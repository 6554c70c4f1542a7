"""MkDocs hook: the reference pages written from the code, so that the code stays their one source.

- ``configuration.md``: the marker ``<!-- config-reference -->`` becomes one table per section of
  :class:`attnmt.config.Config`, a row per key (nested sections and list items included) with its
  type, range (a number key's pydantic ``ge``/``gt``/``le``/``lt``), default and pydantic
  ``description``, and the option a key belongs to (:data:`attnmt.config.APPLIES_ONLY_TO`).
- ``cli.md``: the marker ``<!-- cli-reference -->`` becomes argparse's help of every subcommand of
  :func:`attnmt.cli.build_parser` (nested subcommands included), and ``<!-- environment-reference -->``
  a table of the environment variables attnmt reads (:data:`attnmt.environment.VARIABLES`).
- ``architecture.md``: the marker ``<!-- module-table -->`` becomes a table of every module of
  ``src/attnmt`` with the first paragraph of its docstring, by layer, top layer first (the
  import-linter contract of ``pyproject.toml``).

A key without a description is an error here (and in tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

CONFIG_MARKER = "<!-- config-reference -->"
CLI_MARKER = "<!-- cli-reference -->"
MODULE_MARKER = "<!-- module-table -->"
ENVIRONMENT_MARKER = "<!-- environment-reference -->"
ROOT = Path(__file__).resolve().parents[2]


def _plain(text: str) -> str:
    """Docstring text as one Markdown line: whitespace folded, Sphinx roles (``:class:`X```) as
    code, table bars escaped."""
    text = re.sub(r":(?:mod|class|func|meth|data|attr|exc):`~?\.?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("|", "\\|")


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    """A short readable name of a field's type."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (list, tuple):
        args = typing.get_args(annotation)
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{" + ", ".join(annotation.model_fields) + "}"
    return getattr(annotation, "__name__", str(annotation))


def _bound(value: float) -> str:
    from attnmt.ranges import number_text

    return number_text(value)


def _interval(metadata: list[Any]) -> str:
    """Pydantic constraints as an interval: ``[0, 1)``, ``(0, 100]``; '' where there are none."""
    low = high = None
    flat = [c for m in metadata for c in (getattr(m, "metadata", None) or [m])]  # Field(...) inside Annotated
    for m in flat:
        if isinstance(m, annotated_types.Ge):
            low = f"[{_bound(m.ge)}"
        elif isinstance(m, annotated_types.Gt):
            low = f"({_bound(m.gt)}"
        elif isinstance(m, annotated_types.Le):
            high = f"{_bound(m.le)}]"
        elif isinstance(m, annotated_types.Lt):
            high = f"{_bound(m.lt)})"
    if low is None and high is None:
        return ""
    return f"{low or '(-inf'}, {high or 'inf)'}"


def _range(field: Any) -> str:
    """A number key's range as an interval, its items' for a list or tuple of numbers ('each
    [0, 1)'); '' for other keys."""
    own = _interval(field.metadata)
    if own:
        return own
    items = [_interval(typing.get_args(a)[1:]) for a in typing.get_args(field.annotation)
             if typing.get_origin(a) is typing.Annotated]
    return f"each {items[0]}" if items and items[0] else ""


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def config_rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str, str]]:
    """(dotted key, type, range, default, description) of every key under ``model``, nested
    sections and list items (``data.train[].src``) included.

    Raises:
        ValueError: a key without a description.
    """
    from attnmt.config import APPLIES_ONLY_TO

    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if not field.description:
            raise ValueError(f"configuration key {key} has no description (pydantic Field(description=...))")
        description = _plain(field.description)
        section, _, short = key.partition(".")
        if (section, short) in APPLIES_ONLY_TO:
            opt_section, option, values = APPLIES_ONLY_TO[(section, short)]
            wanted = " or ".join(str(v).lower() if isinstance(v, bool) else v for v in values)
            description += f" *(only with {opt_section}.{option}: {wanted})*"
        type_name = "section" if _models_in(field.annotation) == [field.annotation] else _type_name(field.annotation)
        rows.append((key, type_name, _range(field), _default(field), description))
        for sub in _models_in(field.annotation):
            is_list = typing.get_origin(field.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(field.annotation))
            rows += config_rows(sub, f"{key}[]." if is_list else f"{key}.")
    return rows


def config_reference() -> str:
    """Markdown: for each section of the configuration, its docstring and a table of its keys."""
    from attnmt.config import Config

    out = []
    for name, field in Config.model_fields.items():
        (section,) = _models_in(field.annotation)
        out += [f"## {name}", "", _plain(section.__doc__ or field.description), "",
                "| key | type | range | default | description |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{k}` | {t} | {r} | {d} | {desc} |" for k, t, r, d, desc in config_rows(section, f"{name}.")]
        out.append("")
    return "\n".join(out)


def _subcommands(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((f"{path} {name}", sub))
                out += _subcommands(sub, f"{path} {name}")
    return out


def cli_reference() -> str:
    """Markdown: a section per subcommand with its one-line summary and argparse's help."""
    from attnmt.cli import build_parser

    os.environ["COLUMNS"] = "82"  # argparse wraps help at this width (the code blocks of the theme)
    parser = build_parser()
    summaries = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries.update({a.dest: a.help for a in action._choices_actions})
    out = ["```text", parser.format_help().rstrip(), "```", ""]
    for path, sub in _subcommands(parser, "attnmt"):
        summary = summaries.get(path.split()[1], "") if path.count(" ") == 1 else ""
        out += [f"## {path}", ""] + ([summary[0].upper() + summary[1:] + ".", ""] if summary else [])
        out += ["```text", sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return _plain(doc.split("\n\n")[0])


def module_table() -> str:
    """Markdown: the layers of the import-linter contract, top first, each with its modules and
    their docstrings' first paragraphs."""
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = contract["tool"]["importlinter"]["contracts"][0]["layers"]
    src = ROOT / "src"
    out = ["| layer | module | what it holds |", "| --- | --- | --- |"]
    for n, layer in enumerate(layers, start=1):
        for package in (p.strip() for p in layer.split("|")):
            base = src / package.replace(".", "/")
            files = [base.with_suffix(".py")] if base.with_suffix(".py").is_file() else sorted(
                f for f in base.rglob("*.py") if f.name != "__init__.py" or _summary(f))
            for f in files:
                name = ".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
                out.append(f"| {n} | `{name}` | {_summary(f)} |")
    return "\n".join(out)


def environment_reference() -> str:
    """A table of :data:`attnmt.environment.VARIABLES`: name, what it sets, what it takes."""
    from attnmt.environment import VARIABLES

    takes = {"path": "a path", "url": "an http, https or file URL", "command": "a command name or path",
             "host": "a host name or address"}
    rows = ["| variable | sets | takes |", "| --- | --- | --- |"]
    for v in VARIABLES.values():
        rows.append(f"| `{v.name}` | {v.meaning} | {v.range.describe() if v.range else takes[v.kind]} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Fill the reference markers of configuration.md, cli.md and architecture.md."""
    if MODULE_MARKER in markdown:
        markdown = markdown.replace(MODULE_MARKER, module_table())
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if ENVIRONMENT_MARKER in markdown:
        markdown = markdown.replace(ENVIRONMENT_MARKER, environment_reference())
    return markdown
