"""What every section of the configuration is: a strict pydantic model.

A section forbids unknown keys and checks types, so a typo such as ``modle.d_model`` or
``d_model: big`` is an error naming the key, never silently ignored; no float may be nan or inf,
and a boolean is never a number (YAML's ``on`` for ``train.dropout_curriculum``). A key that
takes one of several names (``train.precision: BF16``, ``train.optimizer: SGD``) takes them in
any case, read as :func:`attnmt.names.canonical_name` spells them.

Library: pydantic.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, ValidationInfo, field_validator

from attnmt.names import canonical_name
from attnmt.ranges import NoBooleanNumbers


def takes_names(annotation: Any) -> bool:
    """Whether a field of this annotation takes one of several names: a ``Literal`` of strings
    (alone, optional or annotated), each spelled as :func:`canonical_name` spells it."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return takes_names(typing.get_args(annotation)[0])
    if origin is Literal:
        names = typing.get_args(annotation)
        return all(isinstance(n, str) and canonical_name(n) == n for n in names)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return origin is not None and len(args) == 1 and takes_names(args[0])


class Section(NoBooleanNumbers):
    """A section of the configuration (the base of every section model)."""

    # allow_inf_nan=False: every float must be finite (an 'lr_factor: .inf' is an error, not a NaN model).
    # Every number key has a range on both sides (Field's ge/gt and le, or a shared attnmt.ranges.Range),
    # and a boolean is never a number (NoBooleanNumbers).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _name_in_any_case(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and takes_names(cls.model_fields[info.field_name].annotation):
            return canonical_name(value)
        return value
