"""The engine interface: source token ids in, scored hypotheses out.

An engine runs a model's search and nothing else. It does not tokenise, sort or batch by
length, format output or handle empty lines: :class:`attnmt.decode.translator.Translator` does
that once, above every engine. Engines are composed into a translator, never subclassed from
it (a subclass that skips its parent's constructor drifts from it silently).

Two kinds of engine are enough. A *step model* engine hands a model that encodes, decodes one
step with a cache and reorders it (``attnmt.search.step_model.StepModel``) to attnmt's own
search; a *whole-search* engine runs its own search under the same options. The stopping rule
written once in the options (``SearchOptions.early_stopping``) lets both give the same output.

- ``attnmt.decode.native.NativeEngine``: the PyTorch model (a step model) with ``attnmt.search``
  (greedy and beam search); supports every option and has every capability.
- ``attnmt.interop.onnx.OnnxEngine``: an ONNX export run by ONNX Runtime (a step model) under
  attnmt's own search; no attention.
- ``attnmt.interop.ctranslate2_engine.CTranslate2Engine``: a CTranslate2 export, whole-search; the
  attention of one layer (its export's alignment layer) with ``return_attention``; scores given
  translations (``score_batch``).

What an engine can do besides searching is declared, never found by type checks: ``supports``
names the search options it honours, ``capabilities`` the extra methods it has
(:data:`CAPABILITIES`). ``attnmt.decode.translator.Translator`` checks both once per request,
before any work (:func:`check_supported`, :func:`require`), and engines trust that check.

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
- Options it lacks (e.g. ``return_attention`` on CTranslate2) are refused by its caller before
  any work (:func:`check_supported`: a one-line :class:`UnsupportedOption`), so ``translate``
  itself does not check them again for every batch.

Shapes: L decoder layers, H heads, T output tokens, S source tokens.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from attnmt.errors import AttnmtError
from attnmt.search.hypothesis import Hypothesis
from attnmt.search.options import CORE_OPTIONS, SearchOptions

__all__ = ["CAPABILITIES", "CORE_OPTIONS", "Engine", "Hypothesis", "PositionError", "SearchOptions",
           "UnsupportedOption", "check_positions", "check_supported", "has_capability", "require"]

# What an engine may have besides ``translate``: capability -> the method that comes with it.
CAPABILITIES = {
    "score": "forced_log_probs(sources, targets) -> per pair, the log-probability of each target id "
             "(forced decoding; attnmt score)",
    "attention": "attention(src_ids, out_ids) -> the source, encoder and decoder attention of a forced output",
    "device": "set_device(name): move the model ('cpu', 'cuda:N', 'mps', 'auto')",
    "precision": "set_precision(precision): 'fp32', 'bf16' or 'int8'",
    "attention_kernel": "set_attention(kind) and attention_kind: 'explicit' or 'fused'",
    "torch_model": "model: the PyTorch Transformer",
}


class UnsupportedOption(AttnmtError, ValueError):
    """A search option the chosen engine cannot honour (the message names both)."""


class PositionError(AttnmtError, ValueError):
    """A sequence longer than the model's positions (the message names the sentence, its
    position and ``max_positions``, as the native model's own check does)."""


def check_positions(sequences: list[list[int]], max_positions: int, what: str, first_line: int = 1) -> None:
    """Refuse, before any engine's library sees them, sequences that need a position the
    model lacks: a sequence of n ids occupies positions 0 .. n - 1 of the encoder (a source,
    EOS included) or the decoder (a forced target: BOS and its ids but the last).

    Args:
        sequences: token ids, one list per sentence.
        max_positions: the model's ``max_positions`` (config.yaml's ``model.max_positions``).
        what: 'source' or 'target', for the message.
        first_line: the 1-based number of ``sequences[0]`` in the user's input.
    Raises:
        PositionError: "target sentence N: position P exceeds max_positions M ..." for the
            first sequence longer than ``max_positions``.
    """
    for n, ids in enumerate(sequences, first_line):
        if len(ids) > max_positions:
            raise PositionError(f"{what} sentence {n}: position {len(ids) - 1} exceeds max_positions {max_positions} "
                                f"({len(ids)} subwords with EOS); shorten it to at most {max_positions - 1} subwords")


@runtime_checkable
class Engine(Protocol):
    """What a translator needs from an engine (module docstring).

    name: 'native', 'ctranslate2' or 'onnxruntime' (shown by ``/v1/models`` and in errors).
    supports: the :class:`SearchOptions` field names it honours (always :data:`CORE_OPTIONS`,
        plus optional features such as 'exact_stopping', 'return_attention' and 'constraints':
        ``SearchOptions.requested``).
    load_options: the loading choices its class takes ('weights', 'precision', 'attention',
        'compute_type'; ``attnmt.interop.engines.check_load_options``).
    capabilities: its extra methods, keys of :data:`CAPABILITIES` (e.g. 'score').
    device: where the search runs, e.g. 'cpu' or 'cuda:0'.
    precision: the arithmetic of the weights, e.g. 'fp32', 'bf16', 'int8', 'int8_float32'.
    """

    name: str
    supports: frozenset[str]
    capabilities: frozenset[str]

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Search every sentence of ``sources`` (module docstring for the contract); the
        caller has checked ``options`` (:func:`check_supported`)."""
        ...


def check_supported(engine: Engine, options: SearchOptions) -> None:
    """Raise :class:`UnsupportedOption` for the first option of ``options.requested()`` that
    ``engine.supports`` lacks (in sorted order, so the message is stable); where it lacks
    'exact_stopping' the line names ``--early-stopping true``."""
    missing = sorted(options.requested() - engine.supports)
    if missing:
        raise UnsupportedOption(f"the {engine.name} engine does not support {missing[0]}"
                                + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else "")
                                + ("; use --early-stopping true (request field early_stopping: true)"
                                   if "exact_stopping" in missing else ""))


def has_capability(engine: Engine, capability: str) -> bool:
    """Whether ``engine`` declares ``capability`` (a key of :data:`CAPABILITIES`; an engine
    that declares no ``capabilities`` has none).

    Raises:
        ValueError: an unknown capability name (a programming error).
    """
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown engine capability {capability!r}")
    return capability in getattr(engine, "capabilities", frozenset())


def require(engine: Engine, capability: str, what: str) -> None:
    """Raise :class:`UnsupportedOption` ("the ENGINE engine does not support WHAT") unless
    ``engine`` declares ``capability`` (:func:`has_capability`).

    Raises:
        ValueError: an unknown capability name (a programming error).
    """
    if not has_capability(engine, capability):
        raise UnsupportedOption(f"the {engine.name} engine does not support {what}")
