"""Greedy decoding with the key/value cache: each step feeds one new position per sentence.

At every step each sentence takes its most probable next token. Sentences that have produced
EOS leave the batch, so late steps cost only what is still being decoded; at its length limit
a sentence ends with the token it has just taken, EOS or not, as in beam search
(``attnmt.search.beam``: one behaviour at the limit for every search and engine).

Shapes: B batch, b sentences still decoded, S source length, D d_model, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnmt.data.tokenizers import EOS_ID
from attnmt.search.hypothesis import Hypothesis, max_output_lengths
from attnmt.search.step_model import StepModel


@torch.no_grad()
def greedy_search(model: StepModel, src: torch.Tensor, max_len_a: float = 1.5, max_len_b: int = 10,
                  on_step: Callable[[int, list[int]], bool] | None = None) -> list[Hypothesis]:
    """Greedy search over a batch of sentences.

    Args:
        model: a step model (``attnmt.search.step_model``), e.g. a Transformer in eval mode.
        src: (B, S) int64 source ids ending with EOS, right-padded.
        max_len_a, max_len_b: output limit ``a * source length + b`` tokens (EOS included);
            a sentence that reaches it ends there without EOS.
        on_step: streaming: after every step, called for each sentence still decoded with its
            batch index and all its tokens so far (in greedy search every token is final).
            Returning True stops that sentence (its result is then cut short).
    Returns:
        One :class:`Hypothesis` per sentence, in input order; ``score == log_prob``.
    """
    batch_size = src.size(0)
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = max_output_lengths(src, model.pad_id, max_len_a, max_len_b, model.config.max_positions - 1)
    cache = model.init_cache()
    active = torch.arange(batch_size, device=src.device)  # sentence index of each live row
    last = torch.full((batch_size, 1), model.config.decoder_start_id, dtype=torch.long, device=src.device)  # (B, 1)
    tokens: list[list[int]] = [[] for _ in range(batch_size)]
    lprobs: list[list[float]] = [[] for _ in range(batch_size)]
    step = 0
    while active.numel():
        logp = model.decode_step(last, memory, src_mask, cache)  # (b, V)
        memory = None  # from now on the cache holds the source keys/values
        best_lp, best = logp.max(dim=-1)  # (b,)
        best_lp = best_lp.float()
        step += 1
        for sent, tok, lp in zip(active.tolist(), best.tolist(), best_lp.tolist()):
            tokens[sent].append(tok)
            lprobs[sent].append(lp)
        done = (best == EOS_ID) | (limits[active] <= step)  # (b,) ended, or cut at the length limit
        if on_step is not None:  # streaming: True stops a sentence
            done |= torch.tensor([on_step(s, tokens[s]) for s in active.tolist()], dtype=torch.bool, device=done.device)
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (b',)
            active, best = active[keep], best[keep]
            src_mask = src_mask.index_select(0, keep)
            cache.reorder(keep, keep)
        last = best[:, None]  # (b, 1)
    return [Hypothesis(t, lp, sum(lp), sum(lp)) for t, lp in zip(tokens, lprobs)]
