"""The engine interface: source token ids in, scored hypotheses out.

An engine runs a model's search and nothing else. It does not tokenise, sort or batch by
length, format output or handle empty lines: :class:`attnmt.decode.translator.Translator` does
that once, above every engine. Engines are composed into a translator, never subclassed from
it (a subclass that skips its parent's constructor drifts from it silently).

The implementations:

- ``attnmt.decode.native.NativeEngine``: the PyTorch model with ``attnmt.search`` (greedy and
  beam search); supports every option.
- ``attnmt.interop.ctranslate2.CTranslate2Engine``: a CTranslate2 export; no attention.
- ``attnmt.interop.onnx.OnnxEngine``: an ONNX export run by ONNX Runtime under attnmt's own
  search; no attention.

Contract of ``Engine.translate(sources, options)``:

- ``sources``: one list of source token ids per sentence, each ending with EOS (as
  ``Translator.encode_sources`` makes them), at most the model's ``max_positions - 1`` long,
  in any order and of mixed lengths. Each sentence's output limit depends on its own length
  only (``SearchOptions.max_len_a`` / ``max_len_b``), never on its neighbours in the call.
- Returns one list per sentence, in input order, of exactly ``options.nbest``
  :class:`Hypothesis` (``attnmt.search.hypothesis``), best first: ``tokens`` the output ids
  ending with EOS unless the length limit cut the hypothesis (then no EOS), ``token_log_probs``
  the natural-log probability of each token, ``log_prob`` their sum, ``score`` what ranked it
  (``SearchOptions.length_penalty_type``), and with ``return_attention`` the best
  hypothesis' ``attention`` (float32 (L, H, T, S), T = len(tokens), S = len(source)).
- Before any work the engine calls :func:`check_supported`: an option it lacks (e.g.
  ``return_attention`` on CTranslate2) is a one-line :class:`UnsupportedOption`.

Shapes: L decoder layers, H heads, T output tokens, S source tokens.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from attnmt.errors import AttnmtError
from attnmt.search.hypothesis import Hypothesis
from attnmt.search.options import CORE_OPTIONS, SearchOptions

__all__ = ["CORE_OPTIONS", "Engine", "Hypothesis", "SearchOptions", "UnsupportedOption", "check_supported"]


class UnsupportedOption(AttnmtError, ValueError):
    """A search option the chosen engine cannot honour (the message names both)."""


@runtime_checkable
class Engine(Protocol):
    """What a translator needs from an engine (module docstring).

    name: 'native', 'ctranslate2' or 'onnxruntime' (shown by ``/v1/models`` and in errors).
    supports: the :class:`SearchOptions` field names it honours (always :data:`CORE_OPTIONS`,
        plus optional features such as 'return_attention' and 'constraints').
    device: where the search runs, e.g. 'cpu' or 'cuda:0'.
    precision: the arithmetic of the weights, e.g. 'fp32', 'bf16', 'int8', 'int8_float32'.
    """

    name: str
    supports: frozenset[str]

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Search every sentence of ``sources`` (module docstring for the contract).

        Raises:
            UnsupportedOption: ``options`` asks for something the engine lacks (before any work).
        """
        ...


def check_supported(engine: Engine, options: SearchOptions) -> None:
    """Raise :class:`UnsupportedOption` for the first option of ``options.requested()`` that
    ``engine.supports`` lacks (in sorted order, so the message is stable)."""
    missing = sorted(options.requested() - engine.supports)
    if missing:
        raise UnsupportedOption(f"the {engine.name} engine does not support {missing[0]}"
                                + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else ""))
