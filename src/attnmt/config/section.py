"""What every section of the configuration is: a strict pydantic model.

A section forbids unknown keys and checks types, so a typo such as ``modle.d_model`` or
``d_model: big`` is an error naming the key, never silently ignored; no float may be nan or inf,
and a boolean is never a number (YAML's ``on`` for ``train.dropout_curriculum``).

Library: pydantic.
"""

from __future__ import annotations

from pydantic import ConfigDict

from attnmt.ranges import NoBooleanNumbers


class Section(NoBooleanNumbers):
    """A section of the configuration (the base of every section model)."""

    # allow_inf_nan=False: every float must be finite (an 'lr_factor: .inf' is an error, not a NaN model).
    # Every number key has a range on both sides (Field's ge/gt and le, or a shared attnmt.ranges.Range),
    # and a boolean is never a number (NoBooleanNumbers).
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
