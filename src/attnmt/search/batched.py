"""Search many sentences: sort by source length, search in batches, hand results back in order.

This is the one batch-translation routine of attnmt: ``Translator.translate`` runs every engine
through :func:`search_in_batches`, and the trainer's validation decoding runs :func:`native_search`
(the native search over the same batches), so validation BLEU and ``attnmt translate`` decode
alike.

The batching (:func:`length_batches`, :func:`search_in_batches`) needs no PyTorch, so engines without
it (CTranslate2) batch here without loading it; the native search (:func:`search_batch`,
:func:`native_search`) imports it when called.

Shapes: B sentences in a batch, S longest source in it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from attnmt.errors import OptionError
from attnmt.search.hypothesis import Hypothesis
from attnmt.search.options import SearchOptions

if TYPE_CHECKING:
    import torch

    from attnmt.search.step_model import StepModel


def length_batches(sources: list[list[int]], batch_size: int) -> list[list[int]]:
    """Indices of ``sources`` in batches of at most ``batch_size``, longest sources first (equal
    lengths keep their input order), so that a batch pads little.

    Raises:
        ValueError: batch_size < 1.
    """
    if batch_size < 1:
        raise OptionError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    return [order[k: k + batch_size] for k in range(0, len(order), batch_size)]


def search_in_batches(sources: list[list[int]], options: SearchOptions, batch_size: int,
                      search: Callable[[list[list[int]], SearchOptions], list[list[Hypothesis]]],
                      workers: int = 1) -> list[list[Hypothesis]]:
    """``search`` over :func:`length_batches` of ``sources``, its per-sentence results in input
    order; each batch is searched with ``options.select(its indices)``, so constraints and
    streaming follow their sentences.

    Args:
        search: e.g. ``Engine.translate``: (batch sources, batch options) -> hypotheses per source.
            With ``workers`` > 1 it is called from that many threads at once, so it must be
            thread-safe (every engine's is: each search has its own cache, and PyTorch, ONNX
            Runtime and CTranslate2 release the GIL while they compute).
        workers: batches searched at the same time (CTranslate2's ``inter_threads``, Marian's CPU
            workers); 1 when ``options.on_step`` streams. Results are the same either way.
    Raises:
        ValueError: workers < 1.
    """
    if workers < 1:
        raise OptionError(f"workers must be at least 1, got {workers}")
    chunks = length_batches(sources, batch_size)

    def run(chunk: list[int]) -> list[list[Hypothesis]]:
        return search([sources[i] for i in chunk], options.select(chunk))

    found = map(run, chunks)
    if workers > 1 and len(chunks) > 1 and options.on_step is None:
        # Speed switch: a pool of threads searches `workers` batches at once, each engine call
        # with its own intra-op threads; on a small CPU this beats one batch on all the cores
        # (benchmarks/RESULTS.md, "Stopping rules and CTranslate2's speed").
        with ThreadPoolExecutor(workers) as pool:
            found = list(pool.map(run, chunks))
    results: list[list[Hypothesis] | None] = [None] * len(sources)
    for chunk, hyps_of_chunk in zip(chunks, found):
        for i, hyps in zip(chunk, hyps_of_chunk, strict=True):
            results[i] = hyps
    return results  # type: ignore[return-value]


def search_batch(model: StepModel, sources: list[list[int]], options: SearchOptions,
                 device: torch.device | None = None) -> list[list[Hypothesis]]:
    """Greedy (``beam_size`` 1) or beam search of one batch with the native model.

    Args:
        model: a step model (``attnmt.search.step_model``): a Transformer in eval mode, or
            ``attnmt.interop.onnx.OnnxTransformer``.
        sources: source ids per sentence, each ending with EOS; padded here.
        options: the search (``return_attention`` is not handled here: ``attnmt.decode.native.NativeEngine``
            adds attention). With ``constraints`` a beam size of 1 runs beam search with one
            beam, ranked by log-probability as greedy search is.
        device: where the padded batch goes; default the CPU.
    Returns:
        ``options.nbest`` hypotheses per sentence, in input order, best first.
    """
    import torch

    with torch.no_grad():
        return _search_batch(model, sources, options, device)


def _search_batch(model: StepModel, sources: list[list[int]], options: SearchOptions,
                  device: torch.device | None) -> list[list[Hypothesis]]:
    from attnmt.data.batching import pad_sequences
    from attnmt.device import to_device
    from attnmt.search.beam import beam_search
    from attnmt.search.greedy import greedy_search

    src = pad_sequences(sources)  # (B, S)
    if device is not None:
        src = to_device(src, device)
    constrained = options.constraints is not None and any(len(c) for c in options.constraints)
    if options.is_greedy and not constrained:
        hyps = greedy_search(model, src, options.max_len_a, options.max_len_b, options.on_step)
        return [[replace(h, score=options.score(h.log_prob, len(h.tokens)))] for h in hyps]
    # Constrained with beam_size 1: beam search with one beam, ranked as greedy search ranks
    # (SearchOptions.score).
    return beam_search(model, src, options if constrained else replace(options, constraints=None))


def native_search(model: StepModel, sources: list[list[int]], options: SearchOptions, batch_size: int,
                  device: torch.device | None = None) -> list[list[Hypothesis]]:
    """:func:`search_batch` over length-sorted batches of ``batch_size`` sentences; results in
    input order (:func:`search_in_batches`)."""
    return search_in_batches(sources, options, batch_size, lambda chunk, opts: search_batch(model, chunk, opts, device))
