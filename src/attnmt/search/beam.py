"""Batched beam search with the GNMT length penalty, two stopping rules and n-best lists.

Length penalty (Wu et al., 2016, equation 14): lp(Y) = ((k + |Y|) / (k + 1))^alpha, with |Y|
the number of output tokens including EOS and k = 5 in the paper (``length_penalty_k``); a
finished hypothesis is ranked by log P(Y | X) / lp(Y). alpha = 0 ranks by log-probability.

Each step keeps K open hypotheses (beams) per sentence. A sentence starts with one hypothesis
(BOS), so the first step runs on one row per sentence, not K (CTranslate2's CPU search does the
same); from the second step on each sentence has K rows. Of the 2K best one-token extensions
(:func:`best_extensions`), those ending with EOS and ranked within the first K become finished
hypotheses; the K best others stay open (fairseq's and CTranslate2's scheme). When a sentence is
done depends on the stopping rule (``SearchOptions.early_stopping``):

- Exact stopping: a sentence is done once it has ``nbest`` finished hypotheses and no open one
  can still beat the worst of them: an open hypothesis with log-probability s <= 0 can at best
  reach s / max(lp(now + 1), lp(max length)), since log-probabilities only fall as it grows. At
  its length limit every open hypothesis is given EOS.
- Early stopping (CTranslate2's ``translate_batch``, src/decoding.cc; fairseq; Kasai et al.,
  2022 for the patience p): a sentence is done once ``round(K x p)`` hypotheses have finished
  (several can finish in one step, so it may have a few more); the best ``nbest`` of them by
  score are returned. At its length limit, the step's K best extensions finish as they are,
  EOS or not (CTranslate2's last step): a hypothesis cut there has no EOS. The length penalty
  only ranks; it never decides when to stop. Sentences with constraints still end with EOS at
  their limit (their phrases are checked when EOS is allowed).

Done sentences leave the batch.

The search owns the decoder's key/value cache and reorders it to follow the surviving beams.
The source side (encoder output, padding mask, source-attention keys and values) is kept once
per sentence, not once per beam: the K beams attend to it together (``MultiHeadAttention``),
and it moves only when sentences leave.

With ``constraints`` (``attnmt.search.constraints``), a sentence's candidates are reordered by
dynamic beam allocation (Post & Vilar, 2018) before the same finishing and selection; EOS waits
until its phrases are met. Sentences without phrases are searched as above, unchanged.

Shapes: B batch (sentences), n sentences still searched, K beam size, k open beams per sentence
(1 at the first step, then K), S source length, V vocabulary, t tokens generated so far.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnmt.data.tokenizers import BOS_ID, EOS_ID
from attnmt.search.constraints import ConstraintTracker, Phrases
from attnmt.search.hypothesis import Hypothesis, max_output_lengths
from attnmt.search.options import finished_wanted, length_penalty
from attnmt.search.step_model import StepModel


@dataclass
class Extensions:
    """The 2K best one-token extensions of each sentence's open beams, best first.

    scores: (n, 2K) float32 log P of each extended prefix. rows: (n, 2K) int64, the row (of the
    n*k beam rows) each extends. tokens: (n, 2K) int64, the new token. token_lp: (n, 2K)
    float32, the new token's log-probability.
    """

    scores: torch.Tensor
    rows: torch.Tensor
    tokens: torch.Tensor
    token_lp: torch.Tensor


def best_extensions(scores: torch.Tensor, logp: torch.Tensor, at_limit: torch.Tensor, width: int) -> Extensions:
    """One step of beam search: the ``width`` (2K) best extensions of each sentence's k open beams.

    Found in two stages, without materialising the k x V candidates of a sentence: each beam's
    2K most probable next tokens (no other extension can be among the sentence's 2K best), then
    the 2K best of those k x 2K.

    Args:
        scores: (n, k) float32 log P of the open beams (-inf for a beam that is not live); k = 1
            at the first step, K afterwards.
        logp: (n*k, V) next-token log-probabilities, the beams of a sentence consecutive; any
            float dtype (scores are accumulated in float32).
        at_limit: (n,) bool, sentences at their length limit: EOS is their only extension.
        width: 2K, the extensions kept per sentence.
    Raises:
        ValueError: a vocabulary smaller than 2K.
    """
    n, k = scores.shape  # k open beams per sentence
    if logp.size(-1) < width:
        raise ValueError(f"vocabulary ({logp.size(-1)}) must hold at least 2 * beam_size ({width}) tokens")
    beam_lp, beam_tok = logp.topk(width, dim=-1)  # (n*k, 2K)
    beam_lp = beam_lp.float()
    if at_limit.any():
        limit_rows = at_limit.repeat_interleave(k)[:, None]  # (n*k, 1)
        eos_lp = torch.full_like(beam_lp, float("-inf"))
        eos_lp[:, :1] = logp[:, EOS_ID:EOS_ID + 1].float()
        beam_lp = torch.where(limit_rows, eos_lp, beam_lp)
        beam_tok = torch.where(limit_rows, torch.full_like(beam_tok, EOS_ID), beam_tok)
    cand = (scores.view(n * k, 1) + beam_lp).view(n, k * width)  # (n, k*2K)
    top_scores, top_idx = cand.topk(width, dim=1)  # (n, 2K)
    rows = top_idx // width + torch.arange(n, device=scores.device)[:, None] * k  # (n, 2K)
    return Extensions(top_scores, rows, beam_tok.view(n, -1).gather(1, top_idx),
                      beam_lp.view(n, -1).gather(1, top_idx))


@dataclass
class _Beams:
    """The open beams of the sentences still searched.

    active: the sentence index (into the batch) of each of the n sentences. scores: (n, k)
    float32 log P of each beam, k = 1 before the first step (BOS only) and K after it. history:
    (n*k, 1+t) int64 tokens, the decoder start token (BOS) first. history_lp: (n*k, t) float32
    log-probability of each generated token.
    """

    active: list[int]
    scores: torch.Tensor
    history: torch.Tensor
    history_lp: torch.Tensor

    @classmethod
    def start(cls, batch_size: int, device: torch.device, start_id: int = BOS_ID) -> "_Beams":
        """One hypothesis per sentence, the decoder start token, log P 0."""
        scores = torch.zeros((batch_size, 1), device=device)
        history = torch.full((batch_size, 1), start_id, dtype=torch.long, device=device)
        return cls(list(range(batch_size)), scores, history, torch.zeros((batch_size, 0), device=device))


def _finish(ext: Extensions, beams: _Beams, finished: list[list[Hypothesis]], alpha: float, k: float,
            cut: torch.Tensor | None = None) -> None:
    """Append the EOS extensions ranked within the first K to their sentence's finished list;
    for the sentences flagged in ``cut`` ((n,) bool: early stopping at the length limit) all of
    the first K, EOS or not."""
    beam_size = ext.tokens.size(1) // 2  # K of the 2K extensions
    ends = ext.tokens[:, :beam_size] == EOS_ID  # (n, K)
    if cut is not None:
        ends |= cut[:, None]
    new = (ends & torch.isfinite(ext.scores[:, :beam_size])).nonzero().tolist()
    if not new:
        return
    rows, tokens_new = ext.rows.tolist(), ext.tokens.tolist()
    token_lp, scores = ext.token_lp.tolist(), ext.scores.tolist()
    for i, j in new:
        r = rows[i][j]
        tokens = beams.history[r, 1:].tolist() + [tokens_new[i][j]]
        log_prob = scores[i][j]
        finished[beams.active[i]].append(Hypothesis(
            tokens, beams.history_lp[r].tolist() + [token_lp[i][j]], log_prob,
            log_prob / length_penalty(len(tokens), alpha, k)))


def _is_done(finished: list[Hypothesis], best_open: float, t: int, limit: int, nbest: int,
             alpha: float, k: float, wanted: int | None = None) -> bool:
    """Whether a sentence's search is over after t tokens (module docstring): its length limit,
    no live beam left, and then under early stopping (``wanted``: the finished hypotheses that
    end it) ``wanted`` finished hypotheses, under exact stopping (``wanted`` None) ``nbest``
    finished hypotheses that no open beam can still beat."""
    if limit <= t or best_open == float("-inf"):
        return True
    if wanted is not None:
        return len(finished) >= wanted
    if len(finished) < nbest:
        return False
    worst_kept = sorted((h.score for h in finished), reverse=True)[nbest - 1]
    bound = best_open / max(length_penalty(t + 1, alpha, k), length_penalty(limit, alpha, k))
    return bound <= worst_kept


@torch.no_grad()
def beam_search(
    model: StepModel, src: torch.Tensor, beam_size: int = 5, alpha: float = 0.6,
    length_penalty_k: float = 5.0, max_len_a: float = 1.5, max_len_b: int = 10, nbest: int = 1,
    constraints: Sequence[Phrases] | None = None, on_step: Callable[[int, list[int]], bool] | None = None,
    early_stopping: bool = False, patience: float = 1.0,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences.

    Args:
        model: a step model (``attnmt.search.step_model``), e.g. a Transformer in eval mode.
        src: (B, S) int64 source ids ending with EOS, right-padded.
        beam_size: K, the open hypotheses kept per sentence.
        alpha, length_penalty_k: the length penalty's exponent and constant (0.6 and 5).
        max_len_a, max_len_b: output limit ``a * source length + b`` tokens (EOS included).
        nbest: hypotheses returned per sentence (1 <= nbest <= beam_size).
        constraints: None, or one entry per sentence: the phrases (target token-id sequences)
            its output must contain (``attnmt.search.constraints``: dynamic beam allocation).
            Sentences without phrases are searched exactly as without constraints; a sentence
            whose phrases cannot fit its length limit is searched without them (a warning).
        on_step: streaming: after every step, called for each sentence still searched with its
            batch index and its *settled* tokens, the longest prefix shared by all its live
            beams and finished hypotheses (every hypothesis the search can still return starts
            with it). Returning True stops that sentence's search (its result is then
            meaningless), e.g. when nobody waits for it any more.
        early_stopping, patience: the stopping rule (module docstring): early stopping after
            ``round(beam_size x patience)`` finished hypotheses (patience >= 1), or exact.
    Returns:
        For each sentence, in input order, ``nbest`` :class:`Hypothesis` sorted best first
        (always ``nbest``, see :func:`_nbest`).
    Raises:
        ValueError: nbest outside [1, beam_size], a vocabulary smaller than 2 * beam_size,
            constraints that do not match the batch or hold special ids, or a patience below 1.
    """
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest must be between 1 and beam_size ({beam_size}), got {nbest}")
    if not patience >= 1:
        raise ValueError(f"patience must be at least 1, got {patience}")
    wanted = finished_wanted(beam_size, patience) if early_stopping else None
    K, device = beam_size, src.device
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S): one row per sentence
    limits = max_output_lengths(src, model.pad_id, max_len_a, max_len_b, model.config.max_positions - 1).tolist()
    tracker = ConstraintTracker(constraints, K, limits) if constraints is not None else None
    cache = model.init_cache()
    beams = _Beams.start(src.size(0), device, model.config.decoder_start_id)
    finished: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    t = 0
    while beams.active:
        logp = model.decode_step(beams.history[:, -1:], memory, src_mask, cache)  # (n*k, V), k = 1 at first
        memory = None  # from now on the cache holds the source keys/values
        at_limit = torch.tensor([limits[s] <= t + 1 for s in beams.active], device=device)  # (n,)
        constrained = tracker is not None and tracker.any(beams.active)
        if constrained:  # no EOS before every phrase is met
            logp = tracker.mask_eos(logp, beams.active)
        cut = None
        if wanted is not None and bool(at_limit.any()):  # early stopping: no EOS forced but for phrases
            phrased = torch.tensor([tracker is not None and bool(tracker.phrases[s]) for s in beams.active],
                                   device=device)  # (n,)
            cut, at_limit = at_limit & ~phrased, at_limit & phrased
        ext = best_extensions(beams.scores, logp, at_limit, 2 * K)
        t += 1
        if constrained:  # dynamic beam allocation reorders a constrained sentence's candidates
            ext = Extensions(*tracker.reorder(ext.scores, ext.rows, ext.tokens, ext.token_lp, beams.scores, logp,
                                              beams.active, t))
        _finish(ext, beams, finished, alpha, length_penalty_k, cut)
        # The K best non-EOS extensions stay open (a stable sort keeps their rank order).
        order = torch.argsort((ext.tokens == EOS_ID).to(torch.int8), dim=1, stable=True)[:, :K]  # (n, K)
        scores = ext.scores.gather(1, order)  # (n, K)
        rows = ext.rows.gather(1, order).view(-1)  # (n*K,)
        tokens = ext.tokens.gather(1, order).view(-1, 1)  # (n*K, 1)
        token_lp = ext.token_lp.gather(1, order).view(-1, 1)  # (n*K, 1)
        best_open = scores.max(dim=1).values.tolist()  # (n,)
        keep = [i for i, sent in enumerate(beams.active)
                if not _is_done(finished[sent], best_open[i], t, limits[sent], nbest, alpha, length_penalty_k, wanted)]
        if on_step is not None:  # streaming: report each kept sentence's settled tokens; True stops it
            keep = [i for i in keep if not on_step(beams.active[i], settled_prefix(
                beams.history, rows, tokens, scores[i], i, finished[beams.active[i]]))]
        if len(keep) < len(beams.active):  # done sentences leave: their beams and source rows
            keep_t = torch.tensor(keep, dtype=torch.long, device=device)
            beam_rows = (keep_t[:, None] * K + torch.arange(K, device=device)).view(-1)  # (n'*K,)
            scores, rows = scores.index_select(0, keep_t), rows.index_select(0, beam_rows)
            tokens, token_lp = tokens.index_select(0, beam_rows), token_lp.index_select(0, beam_rows)
            src_mask = src_mask.index_select(0, keep_t)
            cache.reorder(rows, keep_t)
            beams.active = [beams.active[i] for i in keep]
        else:  # beams moved only within their sentences (after the first step: one row became K), so
            cache.reorder(rows)  # the source side stays in place
        if tracker is not None:
            tracker.advance(rows, tokens.view(-1), beams.active)
        beams.scores = scores
        beams.history = torch.cat([beams.history.index_select(0, rows), tokens], dim=1)
        beams.history_lp = torch.cat([beams.history_lp.index_select(0, rows), token_lp], dim=1)
    return [_nbest(f, nbest) for f in finished]


def settled_prefix(history: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, scores: torch.Tensor,
                   i: int, finished: list[Hypothesis]) -> list[int]:
    """The tokens every hypothesis sentence ``i`` can still end with starts with: the longest
    common prefix of its live beams (their old history ``history[rows]`` plus the new
    ``tokens``; rows and tokens (n*K,) / (n*K, 1), scores (K,) of sentence i) and of its
    finished hypotheses."""
    K = scores.size(0)
    live = torch.isfinite(scores).nonzero()[:, 0] + i * K  # (k,) rows of its live beams
    seqs = [h.tokens for h in finished]
    if live.numel():
        paths = torch.cat([history.index_select(0, rows[live])[:, 1:], tokens[live].view(-1, 1)], dim=1)  # (k, t)
        shared = int((paths == paths[:1]).all(dim=0).long().cumprod(dim=0).sum())
        seqs.append(paths[0, :shared].tolist())
    if not seqs:
        return []
    prefix = seqs[0]
    for seq in seqs[1:]:
        n = 0
        while n < min(len(prefix), len(seq)) and prefix[n] == seq[n]:
            n += 1
        prefix = prefix[:n]
    return prefix


def _nbest(finished: list[Hypothesis], nbest: int) -> list[Hypothesis]:
    """The ``nbest`` best finished hypotheses. A search always finishes K >= nbest of them at the
    length limit, unless every score is NaN or -inf (a model with non-finite weights): then
    the list is filled up with empty hypotheses (only EOS, log-probability and score -inf), so
    that every sentence still gets ``nbest``."""
    ranked = sorted(finished, key=lambda h: h.score, reverse=True)[:nbest]
    return ranked + [Hypothesis([EOS_ID], [float("-inf")], float("-inf"), float("-inf"))
                     for _ in range(nbest - len(ranked))]
