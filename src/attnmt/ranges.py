"""The ranges of the numbers a user gives, defined once for the configuration, the command line
and the HTTP API alike.

A number reaches arithmetic, a tensor's shape or an engine's library (PyTorch, CTranslate2, ONNX
Runtime) only inside its range, so that a huge, negative or non-finite value, or a boolean read
where a number belongs (YAML's ``on`` is ``true``), ends in one line naming the key, option or
field rather than in a library's OverflowError or an allocation that cannot succeed. Each
:class:`Range` here is shared by the places that read the same quantity: ``decode.beam_size``,
``--beam-size`` and a request's ``beam_size`` check :data:`BEAM_SIZE`, so the three cannot
drift. A range read in one place only is written where it is read (a pydantic ``Field``'s
``ge``/``le`` in ``attnmt.config``).
"""

from __future__ import annotations

import math
import numbers
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationInfo, field_validator

from attnmt.errors import OptionError

# The largest count an engine's library takes: CTranslate2's and ONNX Runtime's thread counts and
# PyTorch's ``set_num_threads`` are C ints, and a beam size, hypothesis count or length limit past
# it is no search any machine can hold (CTranslate2's size_t arguments refuse more than 2**64 - 1).
C_INT_MAX = 2**31 - 1


def number_text(value: float) -> str:
    """A bound as the documentation writes it: whole numbers in full (2147483647, not
    2.14748e+09), others in the shortest form ('0.5', '1e-09')."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return f"{value:g}"


@dataclass(frozen=True)
class Range:
    """The numbers from ``low`` to ``high`` (both included, or ``low`` excluded where
    ``low_open``): whole numbers where ``integer``, else finite reals. A boolean is never one.
    """

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    infinite: bool = False  # inf and -inf themselves belong too (a record's "none yet"); nan never

    def describe(self) -> str:
        """The range in words, as error messages and the documentation give it, e.g. 'a whole
        number from 1 to 2147483647' or 'a finite number above 0 and at most 100'."""
        kind = "a finite number"
        if self.integer:
            kind = "a whole number"
        elif self.infinite:
            kind = "a number (inf included)"
        if self.low_open:
            return f"{kind} above {number_text(self.low)} and at most {number_text(self.high)}"
        return f"{kind} from {number_text(self.low)} to {number_text(self.high)}"

    def contains(self, value: Any) -> bool:
        """Whether ``value`` is a number of this range (a bool is not; nan and inf never are)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if math.isnan(value) or (math.isinf(value) and not self.infinite):
            return False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def check(self, value: Any, name: str) -> Any:
        """``value`` (an int for an integer range, else a float) when it lies in the range.

        Args:
            name: how the user gave it, e.g. 'beam_size' (a configuration key or request field)
                or '--length-penalty'.
        Raises:
            ValueError: '{name} {value!r} is out of range: use {describe()}'.
        """
        if not self.contains(value):
            raise OptionError(f"{name} {value!r} is out of range: use {self.describe()}")
        return int(value) if self.integer else float(value)

    def bounds(self) -> dict[str, float]:
        """The range as pydantic ``Field`` constraints (``ge`` or ``gt``, and ``le``)."""
        return {"gt" if self.low_open else "ge": self.low, "le": self.high}


# ---- search (attnmt.search.options.SearchOptions; decode.*, --beam-size ..., a request's fields) ----

# K, hypotheses kept per sentence
BEAM_SIZE = Range(1, C_INT_MAX, integer=True)
# sentences of one search batch
BATCH_SIZE = Range(1, C_INT_MAX, integer=True)
# alpha of the GNMT length penalty ((k + |Y|) / (k + 1))^alpha: past 10 in magnitude the penalty of a
# long output overflows a float (Python's OverflowError; CTranslate2 computes it in float32)
LENGTH_PENALTY = Range(-10.0, 10.0)
# k of the GNMT length penalty
LENGTH_PENALTY_K = Range(0.0, C_INT_MAX)
# a and b of the output length limit a x source length + b (tokens)
MAX_LEN_A = Range(0.0, C_INT_MAX)
MAX_LEN_B = Range(0, C_INT_MAX, integer=True)
# the patience factor of early stopping (round(beam size x patience) must fit a C int too)
PATIENCE = Range(1.0, C_INT_MAX)

# ---- training data (data.train[].weight, distill --mix-original) -----------------------------------

# how many times an epoch samples each pair of a corpus
CORPUS_WEIGHT = Range(0.0, 1000.0, low_open=True)

# ---- downloads (ATTNMT_DOWNLOAD_TIMEOUT) --------------------------------------------------------------

# seconds one downloaded file may take: above 0, at most a week (a socket timeout or a timer much
# further out overflows the platform's time_t, or never fires)
DOWNLOAD_SECONDS = Range(0.0, 7 * 24 * 3600.0, low_open=True)

# ---- processes and threads ------------------------------------------------------------------------

# CPU threads of PyTorch, CTranslate2 or ONNX Runtime (train.num_threads, --threads)
THREADS = Range(1, C_INT_MAX, integer=True)

# ---- the model's shape (model.d_model ..., plot-positions --d-model, --max-len) --------------------

# the width of a layer (d_model, d_ff, head_dim): past 2**16 one weight matrix alone is 2**32 numbers
WIDTH = Range(1, 2**16, integer=True)
# positions a model (or a drawing of positional encodings) covers, in tokens
POSITIONS = Range(1, 2**20, integer=True)
# attention heads, and encoder or decoder layers
HEADS = Range(1, 1024, integer=True)
LAYERS = Range(1, 1024, integer=True)
# pieces of a vocabulary (tokenizer.vocab_size, an imported model's vocab_size)
VOCABULARY = Range(1, 2**20, integer=True)
# a probability (a dropout rate, an imported model's)
PROBABILITY = Range(0.0, 1.0)


# ---- booleans are not numbers -----------------------------------------------------------------------


def _scalar_types(annotation: Any) -> set[Any]:
    """The scalar types an annotation admits: ``int | None`` -> {int, NoneType}, ``list[int]`` ->
    {int}, ``tuple[Annotated[float, ...], ...]`` -> {float}, ``Literal['a', True]`` -> {str, bool}."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _scalar_types(typing.get_args(annotation)[0])
    if origin is Literal:
        return {type(v) for v in typing.get_args(annotation)}
    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if args:
        return set().union(*(_scalar_types(a) for a in args))
    return {annotation}


def numbers_only(annotation: Any) -> bool:
    """Whether a field of this annotation holds numbers (int or float, alone or in a list or
    tuple) and no boolean."""
    scalars = _scalar_types(annotation)
    return bool(scalars & {int, float}) and bool not in scalars


def _holds_boolean(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, bool) for v in value)
    return isinstance(value, bool)


class NoBooleanNumbers(BaseModel):
    """A pydantic model whose number fields refuse booleans. Pydantic's lax mode reads ``true``
    as 1 for an int or float field, and YAML reads ``on``, ``off``, ``yes`` and ``no`` as
    booleans, so ``train.dropout_curriculum: on`` would otherwise train with 1.

    Raises:
        pydantic.ValidationError: a boolean (or a list holding one) given to a number field,
            'a boolean is not a number ...' under the field's name.
    """

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any, info: ValidationInfo) -> Any:
        if _holds_boolean(value) and numbers_only(cls.model_fields[info.field_name].annotation):
            raise OptionError("a boolean is not a number (YAML reads true, false, on, off, yes and no as booleans)")
        return value


# ---- the fields of the files attnmt reads back ---------------------------------------------------------

# a count of pairs, lines, tokens, bytes, steps or epochs recorded in a file (numpy's int64 offsets)
COUNT = Range(0, 2**63 - 1, integer=True)
# a file's modification time in nanoseconds (before 1970 is negative)
TIME_NS = Range(-(2**63), 2**63 - 1, integer=True)
# seconds measured and recorded (a preparation's wall time): at most about 30,000 years
SECONDS = Range(0.0, 1e12)


def check_record(record: Any, where: str) -> None:
    """Check every field of ``record``, a dataclass read back from a file, as the parser checks
    a number: a field's ``metadata['range']`` (a :class:`Range`) where it has one, else
    :data:`COUNT` for an int and :data:`SECONDS` for a float; a str field must hold a str, a
    bool field a bool; nested dataclasses, lists and dicts of them, and dicts of ints
    (``dict[str, int]``, each value a :data:`COUNT`) are checked item by item. A field whose
    ``metadata['items']`` maps keys to a :class:`Range` or a type checks each dict of its list
    (``list[dict]``) by them. None passes where the annotation admits it.

    Raises:
        OptionError: '{where}: {field} {value!r} is out of range: use ...' (or 'is not a ...'),
            the field dotted from ``record`` ('train.corpora[0].weight').
    """
    import dataclasses

    hints = typing.get_type_hints(type(record))
    for f in dataclasses.fields(record):
        _check_value(getattr(record, f.name), hints[f.name], f.metadata, f"{where}{f.name}")


def _check_value(value: Any, annotation: Any, metadata: Any, name: str) -> None:
    import dataclasses

    args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
    if value is None and type(None) in args:
        return
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        annotation = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(annotation), list(typing.get_args(annotation))
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, annotation):
            raise OptionError(f"{name} {value!r} is not a record")
        check_record(value, f"{name}.")
    elif origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise OptionError(f"{name} {value!r} is not a list")
        if origin is tuple and len(args) > 1 and len(value) != len(args):
            raise OptionError(f"{name} {value!r} is not a list of {len(args)} items")
        for i, item in enumerate(value):
            item_type = args[i] if origin is tuple and len(args) > 1 else args[0]
            _check_value(item, item_type, metadata, f"{name}[{i}]")
    elif origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise OptionError(f"{name} {value!r} is not a mapping of names")
        for key, item in value.items():
            _check_value(item, args[1], metadata, f"{name}.{key}")
    elif annotation is dict and "items" in metadata:
        if not isinstance(value, dict):
            raise OptionError(f"{name} {value!r} is not a mapping of names")
        for key, kind in metadata["items"].items():
            _check_value(value.get(key), kind if isinstance(kind, type) else int, {"range": kind}, f"{name}.{key}")
    elif annotation in (int, float):
        default = COUNT if annotation is int else SECONDS
        rng = metadata.get("range", default) if isinstance(metadata.get("range"), Range) else default
        rng.check(value, name)
    elif annotation in (str, bool):
        if not isinstance(value, annotation):
            raise OptionError(f"{name} {value!r} is not a {'text' if annotation is str else 'boolean'}")
