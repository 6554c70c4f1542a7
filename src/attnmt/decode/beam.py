"""Batched beam search with the GNMT length penalty, exact stopping and n-best lists.

Length penalty (Wu et al., 2016, equation 14):  lp(Y) = ((k + |Y|) / (k + 1))^alpha, with
|Y| the number of output tokens including EOS; a finished hypothesis is ranked by
log P(Y | X) / lp(Y). alpha = 0 ranks by log-probability alone.

Each step keeps K open hypotheses per sentence. Of the 2K best extensions, those ending in EOS
and ranked within the first K become finished hypotheses; the K best others stay open
(fairseq's scheme). A sentence is done once it has ``nbest`` finished hypotheses and no open
one can still beat the worst of them: an open hypothesis with log-probability s <= 0 can at
best reach s / max(lp(now + 1), lp(max length)), since log-probabilities only fall as it grows.
At its length limit every hypothesis is forced to end with EOS. Done sentences leave the batch.
Each step reorders the cached self-attention keys/values to follow the surviving beams. The
source side (encoder output, padding mask, source-attention keys/values) is kept once per
sentence: its K beams attend to it together, as K query positions (see ``DecoderLayer``), and
it moves only when sentences leave.

The 2K best extensions of a sentence are found in two stages, without materialising its K x V
candidate scores: each beam's 2K most probable next tokens (no extension outside them can be
among the sentence's 2K best), then the 2K best of those K x 2K. Scores are accumulated in
float32 whatever the model's dtype.

Shapes: B batch (sentences), n sentences still searched, K beam size, S source length,
D d_model, V vocabulary, t tokens generated so far.
"""

from __future__ import annotations

import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID
from attnmt.decode.search import Hypothesis, max_output_lengths
from attnmt.model.transformer import Transformer


def length_penalty(length: int | float, alpha: float, k: float = 5.0) -> float:
    """lp(Y) = ((k + |Y|) / (k + 1))^alpha (Wu et al., 2016, eq. 14); 1 when alpha is 0."""
    return ((k + length) / (k + 1.0)) ** alpha


def _best_open_bound(best_open: float, length_now: int, max_len: int, alpha: float, k: float) -> float:
    """Highest normalised score an open hypothesis with log-prob ``best_open`` could still reach."""
    return best_open / max(length_penalty(length_now + 1, alpha, k), length_penalty(max_len, alpha, k))


@torch.no_grad()
def beam_search(
    model: Transformer, src: torch.Tensor, beam_size: int = 5, alpha: float = 0.6, k: float = 5.0,
    max_len_a: float = 1.5, max_len_b: int = 10, nbest: int = 1,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences.

    Args:
        model: a Transformer in eval mode.
        src: (B, S) int64 source ids ending with EOS, right-padded.
        beam_size: K, open hypotheses kept per sentence.
        alpha, k: length penalty parameters (defaults 0.6 and 5).
        max_len_a, max_len_b: output limit a * source length + b tokens (EOS included).
        nbest: hypotheses returned per sentence (1 <= nbest <= beam_size).
    Returns:
        For each sentence in input order, ``nbest`` :class:`Hypothesis` sorted best first.
    Raises:
        ValueError: nbest outside [1, beam_size], or a vocabulary smaller than 2 * beam_size.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size ({beam_size}), got {nbest}")
    batch_size, K = src.size(0), beam_size
    device = src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = max_output_lengths(src, max_len_a, max_len_b, model.config.max_positions - 1).tolist()
    # Every sentence gets K consecutive rows of the target side (B*K); the source side (memory,
    # src_mask and the cached source keys/values) stays one row per sentence, shared by its beams.
    cache = model.init_cache()

    active = list(range(batch_size))  # sentence index of each of the n searched sentences
    scores = torch.full((batch_size, K), float("-inf"), device=device)  # (n, K) log P of open beams
    scores[:, 0] = 0.0  # at the start only one hypothesis (BOS) is live
    history = torch.full((batch_size * K, 1), BOS_ID, dtype=torch.long, device=device)  # (n*K, 1+t)
    history_lp = torch.zeros((batch_size * K, 0), device=device)  # (n*K, t)
    finished: list[list[Hypothesis]] = [[] for _ in range(batch_size)]
    t = 0
    while active:
        n = len(active)
        logp = model.decode_step(history[:, -1:], memory, src_mask, cache)  # (n*K, V), model dtype
        memory = None  # from now on the cache holds the source keys/values
        vocab = logp.size(-1)
        if vocab < 2 * K:
            raise ValueError(f"vocabulary ({vocab}) must hold at least 2 * beam_size ({2 * K}) tokens")
        # Stage 1: each beam's 2K most probable tokens.
        beam_lp, beam_tok = logp.topk(2 * K, dim=-1)  # (n*K, 2K)
        beam_lp = beam_lp.float()
        at_limit = torch.tensor([limits[s] <= t + 1 for s in active], device=device)  # (n,)
        if at_limit.any():  # sentences at their length limit: EOS is every beam's only extension
            limit_rows = at_limit.repeat_interleave(K)[:, None]  # (n*K, 1)
            eos_lp = torch.full_like(beam_lp, float("-inf"))
            eos_lp[:, :1] = logp[:, EOS_ID:EOS_ID + 1].float()
            beam_lp = torch.where(limit_rows, eos_lp, beam_lp)
            beam_tok = torch.where(limit_rows, torch.full_like(beam_tok, EOS_ID), beam_tok)
        # Stage 2: the sentence's 2K best of its K x 2K extensions.
        cand = (scores.view(n * K, 1) + beam_lp).view(n, 2 * K * K)  # (n, K*2K)
        top_scores, top_idx = cand.topk(2 * K, dim=1)  # (n, 2K)
        origin = top_idx // (2 * K)  # (n, 2K) which open beam each candidate extends
        token = beam_tok.view(n, 2 * K * K).gather(1, top_idx)  # (n, 2K)
        cand_lp = beam_lp.view(n, 2 * K * K).gather(1, top_idx)  # (n, 2K) log-prob of the new token
        is_eos = token == EOS_ID
        rows = origin + torch.arange(n, device=device)[:, None] * K  # (n, 2K) rows of history
        t += 1

        # Finalise EOS candidates ranked within the first K.
        new_final = (is_eos[:, :K] & torch.isfinite(top_scores[:, :K])).nonzero().tolist()
        if new_final:
            rows_l, cand_lp_l, top_l = rows.tolist(), cand_lp.tolist(), top_scores.tolist()
            for i, j in new_final:
                r = rows_l[i][j]
                lps = history_lp[r].tolist() + [cand_lp_l[i][j]]
                tokens = history[r, 1:].tolist() + [EOS_ID]
                log_prob = top_l[i][j]
                finished[active[i]].append(
                    Hypothesis(tokens, lps, log_prob, log_prob / length_penalty(len(tokens), alpha, k)))

        # The K best non-EOS candidates stay open (a stable sort keeps their rank order).
        order = torch.argsort(is_eos.to(torch.int8), dim=1, stable=True)[:, :K]  # (n, K)
        scores = top_scores.gather(1, order)  # (n, K)
        sel_rows = rows.gather(1, order).view(-1)  # (n*K,)
        sel_tokens = token.gather(1, order).view(-1, 1)  # (n*K, 1)
        sel_lp = cand_lp.gather(1, order).view(-1, 1)  # (n*K, 1)

        # Which sentences are done?
        keep = []
        best_open = scores.max(dim=1).values.tolist()  # (n,)
        for i, sent in enumerate(active):
            fin = finished[sent]
            done = limits[sent] <= t
            if not done and len(fin) >= nbest and best_open[i] != float("-inf"):
                worst_kept = sorted((h.score for h in fin), reverse=True)[nbest - 1]
                done = _best_open_bound(best_open[i], t, limits[sent], alpha, k) <= worst_kept
            elif best_open[i] == float("-inf"):
                done = True
            if not done:
                keep.append(i)
        if len(keep) < n:
            keep_t = torch.tensor(keep, dtype=torch.long, device=device)
            scores = scores.index_select(0, keep_t)
            beam_keep = (keep_t[:, None] * K + torch.arange(K, device=device)).view(-1)  # (n'*K,)
            sel_rows = sel_rows.index_select(0, beam_keep)
            sel_tokens = sel_tokens.index_select(0, beam_keep)
            sel_lp = sel_lp.index_select(0, beam_keep)
            src_mask = src_mask.index_select(0, keep_t)
            active = [active[i] for i in keep]
            cache.reorder(sel_rows, keep_t)
        else:
            # Beams moved only within their sentence: source keys/values are already in place.
            cache.reorder(sel_rows)
        history = torch.cat([history.index_select(0, sel_rows), sel_tokens], dim=1)
        history_lp = torch.cat([history_lp.index_select(0, sel_rows), sel_lp], dim=1)

    return [sorted(f, key=lambda h: h.score, reverse=True)[:nbest] for f in finished]
