"""The options of one search call, shared by every engine (native, CTranslate2, ONNX Runtime),
and the defaults of a call's stopping rule.

They live in the search layer so that training (validation decoding) and translation build the
same object; ``attnmt.decode.engine`` re-exports :class:`SearchOptions` and says which engine
supports which option.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from attnmt.errors import OptionError
from attnmt import ranges
from attnmt.data.tokenizers import EOS_ID
from attnmt.ranges import C_INT_MAX, Range
from attnmt.search.hypothesis import Hypothesis

LENGTH_PENALTY_TYPES = ("gnmt", "average")


def check_count(value: Any, name: str, low: int = 1, high: int = C_INT_MAX) -> int:
    """``value`` when it is a whole number in [low, high], the range the engines' libraries take
    (:data:`attnmt.ranges.C_INT_MAX`), so that a huge number ends in one line naming it rather
    than in the library's TypeError, OverflowError or an allocation that cannot succeed.

    Args:
        name: how the user gave it, e.g. 'beam_size' (a config key or request field) or 'threads'.
    Raises:
        ValueError: not an integer (a bool is not one), or outside [low, high]; the message names
            ``name``, the value and the range.
    """
    return Range(low, high, integer=True).check(value, name)


def check_real(value: Any, name: str, low: float = 0.0, high: float = C_INT_MAX) -> float:
    """``value`` when it is a finite number in [low, high] (a length factor, penalty or patience
    that the engines turn into lengths and counts). Raises ValueError naming ``name`` otherwise."""
    return Range(low, high).check(value, name)


# Options every engine must honour; the others are features an engine may lack (see
# ``SearchOptions.requested`` and ``attnmt.decode.engine.check_supported``).
CORE_OPTIONS = frozenset({"beam_size", "nbest", "length_penalty", "length_penalty_type", "length_penalty_k",
                          "max_len_a", "max_len_b", "early_stopping", "patience"})


def finished_wanted(beam_size: int, patience: float) -> int:
    """How many finished hypotheses end a sentence's beam search under early stopping:
    ``beam_size x patience`` rounded half away from zero (CTranslate2's
    ``std::round(beam_size * patience)``; Kasai et al., 2022, "Beam Decoding with Controlled
    Patience"). Python's ``round`` would round 4.5 to 4, so it is not used."""
    return int(math.floor(beam_size * patience + 0.5))


def length_penalty(length: int | float, alpha: float, k: float = 5.0) -> float:
    """lp(Y) = ((k + |Y|) / (k + 1))^alpha (Wu et al., 2016, equation 14); 1 when alpha is 0."""
    return ((k + length) / (k + 1.0)) ** alpha


def penalised_score(log_prob: float, length: int, alpha: float, k: float = 5.0) -> float:
    """log P / lp(|Y|), the GNMT-penalised score (:func:`length_penalty`); ``length`` in tokens,
    EOS included."""
    return log_prob / length_penalty(length, alpha, k)


def empty_hypothesis() -> Hypothesis:
    """What fills an n-best list that a search could not fill: EOS only, log P and score -inf."""
    return Hypothesis([EOS_ID], [float("-inf")], float("-inf"), float("-inf"))


def best_of(hyps: Iterable[Hypothesis], nbest: int) -> list[Hypothesis]:
    """The ``nbest`` best of ``hyps`` by ``score``, best first (a stable sort: equal scores keep
    their order). A search finishes at least ``nbest`` hypotheses unless every score is NaN or
    -inf (a model with non-finite weights); the list is then filled up with
    :func:`empty_hypothesis`, so that every sentence gets ``nbest``."""
    ranked = sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest]
    return ranked + [empty_hypothesis() for _ in range(nbest - len(ranked))]


def stopping_rule(decode: Any, early_stopping: bool | None = None, patience: float | None = None
                  ) -> tuple[bool, float]:
    """A call's stopping rule, ``(early_stopping, patience)`` of :class:`SearchOptions`: the
    values given (``attnmt translate / evaluate / serve --early-stopping --patience``, the
    fields of an HTTP request), else the defaults of ``decode`` (a ``DecodeConfig``). A patience
    not given is ``decode.patience``, except that ``early_stopping`` given as False alone resets
    it to 1 (a patience applies only to early stopping).

    Not checked here: a patience other than 1 without early stopping is refused by
    :class:`SearchOptions` (ValueError).
    """
    if early_stopping is None:
        early_stopping = decode.early_stopping
    elif patience is None and not early_stopping:
        patience = 1.0
    if patience is None:
        patience = decode.patience
    return early_stopping, patience


@dataclass(frozen=True)
class SearchOptions:
    """How to search: greedy (``beam_size`` 1) or beam search, the ranking and the length limit.

    beam_size: K, open hypotheses per sentence (1 = greedy search).
    nbest: hypotheses returned per sentence, best first (1 <= nbest <= beam_size).
    length_penalty_type: 'gnmt': score = log P / ((k + |Y|) / (k + 1))^alpha (Wu et al., 2016,
        equation 14) in beam search, log P in greedy search; 'average': score = log P / |Y|
        in both (the mean log-probability per token). |Y| counts EOS.
    length_penalty: alpha of the GNMT penalty (unused by 'average').
    length_penalty_k: k of the GNMT penalty (5 in the paper).
    max_len_a, max_len_b: each sentence's output limit, ``floor(a * source length + b)`` tokens
        with EOS (source length with its EOS), at most the model's ``max_positions - 1``. What
        happens there depends on the stopping rule (``attnmt.search.beam``): greedy search and
        exact beam search give every hypothesis still open EOS; early-stopping beam search
        finishes its K best extensions as they are (a hypothesis cut there has no EOS).
    early_stopping: the beam search's stopping rule (``attnmt.search.beam``). True: a sentence
        is done once ``round(beam_size x patience)`` hypotheses have finished (CTranslate2's,
        fairseq's and Hugging Face's rule). False: exact stopping, done once no open hypothesis
        can still beat the ``nbest`` finished ones (an optional feature, 'exact_stopping' in
        :meth:`requested`: the CTranslate2 engine lacks it). Greedy search is the same under both.
    patience: the patience factor p >= 1 of early stopping (Kasai et al., 2022): wait for
        ``round(K x p)`` finished hypotheses instead of K. Only with ``early_stopping``.
    return_attention: also return the best hypothesis' encoder-decoder attention.
    return_token_log_probs: fill ``Hypothesis.token_log_probs``. The native and ONNX Runtime
        searches have them anyway; CTranslate2's early-stopping search returns only each
        hypothesis' total, so with False it leaves them empty and skips a forced-decoding pass.
    constraints: lexically constrained search (``attnmt.search.constraints``, dynamic beam
        allocation): one entry per source sentence of the call, each a sequence of phrases
        (target token-id sequences) that the output must contain; None = unconstrained.
    on_step: streaming: called after each search step with a sentence's index in the call and
        its settled tokens (``attnmt.search.beam.beam_search``); returning True stops that
        sentence. None = no streaming.

    Raises:
        ValueError: a number outside its range of :mod:`attnmt.ranges` (beam_size, the length
            limits, length_penalty and length_penalty_k, patience; a bool is no number), nbest
            outside [1, beam_size], an unknown length_penalty_type, a patience whose
            ``round(beam_size x patience)`` is over C_INT_MAX, or a patience other than 1
            without early stopping. The message names the field.
    """

    beam_size: int = 1
    nbest: int = 1
    length_penalty: float = 0.6
    length_penalty_type: str = "gnmt"
    length_penalty_k: float = 5.0
    max_len_a: float = 1.5
    max_len_b: int = 10
    early_stopping: bool = False
    patience: float = 1.0
    return_attention: bool = False
    return_token_log_probs: bool = True
    constraints: Sequence[Sequence[Sequence[int]]] | None = None
    on_step: Callable[[int, list[int]], bool] | None = None

    def __post_init__(self) -> None:
        ranges.BEAM_SIZE.check(self.beam_size, "beam_size")
        if isinstance(self.nbest, bool) or not (isinstance(self.nbest, numbers.Integral)
                                                and 1 <= self.nbest <= self.beam_size):
            raise OptionError(f"nbest ({self.nbest}) must be between 1 and the beam size ({self.beam_size})")
        if self.length_penalty_type not in LENGTH_PENALTY_TYPES:
            raise OptionError(f"unknown length_penalty_type {self.length_penalty_type!r}; use gnmt or average")
        ranges.MAX_LEN_A.check(self.max_len_a, "max_len_a")
        ranges.MAX_LEN_B.check(self.max_len_b, "max_len_b")
        ranges.LENGTH_PENALTY_K.check(self.length_penalty_k, "length_penalty_k")
        ranges.LENGTH_PENALTY.check(self.length_penalty, "length_penalty")
        ranges.PATIENCE.check(self.patience, "patience")
        if self.early_stopping and self.beam_size * self.patience + 0.5 >= C_INT_MAX + 1:  # floats: cannot overflow
            raise OptionError(f"patience {self.patience} is out of range: round(beam_size x patience) finished "
                             f"hypotheses must be at most {C_INT_MAX} (beam_size {self.beam_size})")
        if self.patience != 1 and not self.early_stopping:
            raise OptionError(f"patience ({self.patience}) applies only to early stopping (early_stopping true)")

    @classmethod
    def from_config(cls, decode: Any, **overrides: Any) -> "SearchOptions":
        """The options of a ``DecodeConfig`` (``attnmt.config``), with ``overrides`` (None values
        are ignored, so callers can pass optional arguments straight through)."""
        values = {f.name: getattr(decode, f.name) for f in fields(cls) if hasattr(decode, f.name)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def finished_wanted(self) -> int | None:
        """Finished hypotheses that end a sentence's beam search (:func:`finished_wanted`), or
        None under exact stopping."""
        return finished_wanted(self.beam_size, self.patience) if self.early_stopping else None

    @property
    def is_greedy(self) -> bool:
        """One hypothesis per sentence from greedy search."""
        return self.beam_size == 1

    def score(self, log_prob: float, length: int) -> float:
        """What ranks a hypothesis of natural-log probability ``log_prob`` and ``length`` tokens
        (EOS included), the rule of every engine: 'average': log P / |Y|; 'gnmt': log P in
        greedy search (``beam_size`` 1), log P / lp(|Y|) in beam search (:func:`penalised_score`)."""
        if self.length_penalty_type == "average":
            return log_prob / max(length, 1)
        if self.is_greedy:
            return log_prob
        return penalised_score(log_prob, length, self.length_penalty, self.length_penalty_k)

    def best(self, hyps: Iterable[Hypothesis]) -> list[Hypothesis]:
        """The ``nbest`` best of ``hyps`` by their ``score``, best first, filled up as
        :func:`best_of` says."""
        return best_of(hyps, self.nbest)

    def requested(self) -> frozenset[str]:
        """The option names this call needs an engine to honour: :data:`CORE_OPTIONS` and each
        optional feature that is switched on ('exact_stopping': beam search without
        ``early_stopping``)."""
        extra = {"return_attention"} if self.return_attention else set()
        if not self.is_greedy and not self.early_stopping:
            extra.add("exact_stopping")
        if self.constraints is not None and any(len(c) for c in self.constraints):
            extra.add("constraints")
        if self.on_step is not None:
            extra.add("streaming")
        return CORE_OPTIONS | extra

    def select(self, indices: Sequence[int]) -> "SearchOptions":
        """The options of a call over the sentences ``indices`` of this one: the per-sentence
        fields (``constraints``, the sentence index given to ``on_step``) follow their sentences."""
        if self.constraints is None and self.on_step is None:
            return self
        idx = list(indices)
        on_step = self.on_step
        return replace(self, constraints=None if self.constraints is None else [self.constraints[i] for i in idx],
                       on_step=None if on_step is None else (lambda i, tokens: on_step(idx[i], tokens)))
