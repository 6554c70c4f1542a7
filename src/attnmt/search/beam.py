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
  reach s / max(lp(now + 1), lp(max length)), since log-probabilities only fall as it grows.
- Early stopping (CTranslate2's ``translate_batch``, src/decoding.cc; fairseq; Kasai et al.,
  2022 for the patience p): a sentence is done once ``round(K x p)`` hypotheses have finished
  (several can finish in one step, so it may have a few more); the best ``nbest`` of them by
  score are returned. The length penalty only ranks; it never decides when to stop.

At its length limit (under either rule, and in greedy search: one behaviour for every search
and engine) a sentence's last step finishes its K best extensions as they are, EOS or not
(CTranslate2's last step): a hypothesis cut there has no EOS, and its score is that of the
tokens it has. A constrained sentence's hypotheses must hold their phrases and end with EOS
within the limit, so there the constraint step offers only EOS candidates.

Each step is select (:func:`_select`: the 2K best extensions, reordered by the constraint step
where a sentence has phrases), finish (:func:`_finish`: scored by ``SearchOptions.score``) and
prune (:func:`_prune`: the K best open extensions become the beams). Done sentences leave the
batch.

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

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnmt.errors import OptionError
from attnmt.data.tokenizers import BOS_ID, EOS_ID
from attnmt.search.constraints import ConstraintTracker
from attnmt.search.hypothesis import Hypothesis, max_output_lengths
from attnmt.search.options import SearchOptions
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


def best_extensions(scores: torch.Tensor, logp: torch.Tensor, width: int) -> Extensions:
    """One step of beam search: the ``width`` (2K) best extensions of each sentence's k open beams.

    Found in two stages, without materialising the k x V candidates of a sentence: each beam's
    2K most probable next tokens (no other extension can be among the sentence's 2K best), then
    the 2K best of those k x 2K.

    Args:
        scores: (n, k) float32 log P of the open beams (-inf for a beam that is not live); k = 1
            at the first step, K afterwards.
        logp: (n*k, V) next-token log-probabilities, the beams of a sentence consecutive; any
            float dtype (scores are accumulated in float32).
        width: 2K, the extensions kept per sentence.
    Raises:
        ValueError: a vocabulary smaller than 2K.
    """
    n, k = scores.shape  # k open beams per sentence
    if logp.size(-1) < width:
        raise OptionError(f"vocabulary ({logp.size(-1)}) must hold at least 2 * beam_size ({width}) tokens")
    beam_lp, beam_tok = logp.topk(width, dim=-1)  # (n*k, 2K)
    beam_lp = beam_lp.float()
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


def _finish(ext: Extensions, beams: _Beams, finished: list[list[Hypothesis]], score: Callable[[float, int], float],
            cut: torch.Tensor | None = None) -> None:
    """Append the EOS extensions ranked within the first K to their sentence's finished list,
    scored by ``score(log P, length)``; for the sentences flagged in ``cut`` ((n,) bool: at
    their length limit) all of the first K, EOS or not."""
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
            score(log_prob, len(tokens))))


def _is_done(finished: list[Hypothesis], best_open: float, t: int, limit: int, nbest: int,
             score: Callable[[float, int], float], wanted: int | None = None) -> bool:
    """Whether a sentence's search is over after t tokens (module docstring): its length limit,
    no live beam left, and then under early stopping (``wanted``: the finished hypotheses that
    end it) ``wanted`` finished hypotheses, under exact stopping (``wanted`` None) ``nbest``
    finished hypotheses that no open beam can still beat: its best log P ``best_open`` <= 0 can
    at best reach the larger of ``score(best_open, t + 1)`` and ``score(best_open, limit)``."""
    if limit <= t or best_open == float("-inf"):
        return True
    if wanted is not None:
        return len(finished) >= wanted
    if len(finished) < nbest:
        return False
    worst_kept = sorted((h.score for h in finished), reverse=True)[nbest - 1]
    bound = max(score(best_open, t + 1), score(best_open, limit))
    return bound <= worst_kept


class _NoConstraints:
    """The constraint step of a search without constraints: it changes nothing."""

    def any(self, active: list[int]) -> bool:
        return False

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor, active: list[int]) -> None:
        pass


def _select(beams: _Beams, logp: torch.Tensor, limits: list[int], t: int, options: SearchOptions,
            constraint: ConstraintTracker | _NoConstraints) -> tuple[Extensions, torch.Tensor | None]:
    """Select: the 2K best extensions of each sentence after t tokens (:func:`best_extensions`),
    reordered by the constraint step where a sentence has phrases, and the (n,) bool sentences
    at their length limit, whose K best finish as they are (None when there are none)."""
    at_limit = torch.tensor([limits[s] <= t + 1 for s in beams.active], device=logp.device)  # (n,)
    constrained = constraint.any(beams.active)
    if constrained:  # no EOS before every phrase is met
        logp = constraint.mask_eos(logp, beams.active)
    cut = at_limit if bool(at_limit.any()) else None
    ext = best_extensions(beams.scores, logp, 2 * options.beam_size)
    if constrained:  # dynamic beam allocation reorders a constrained sentence's candidates
        ext = Extensions(*constraint.reorder(ext.scores, ext.rows, ext.tokens, ext.token_lp, beams.scores, logp,
                                             beams.active, t + 1))
    return ext, cut


def _prune(opened: Extensions, beams: _Beams, keep: list[int], src_mask: torch.Tensor, cache,
           constraint: ConstraintTracker | _NoConstraints) -> torch.Tensor:
    """Prune: the open extensions (:func:`_open`) of the sentences ``keep`` (indices into
    ``beams.active``) become the beams; done sentences leave with their beams, source rows and
    cache rows. Updates ``beams``, the cache and the constraint step; returns the (n', 1, 1, S)
    source mask of the sentences still searched."""
    scores = opened.scores
    rows = opened.rows
    tokens = opened.tokens
    token_lp = opened.token_lp
    K, device = scores.size(1), scores.device
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
    constraint.advance(rows, tokens.view(-1), beams.active)
    beams.scores = scores
    beams.history = torch.cat([beams.history.index_select(0, rows), tokens], dim=1)
    beams.history_lp = torch.cat([beams.history_lp.index_select(0, rows), token_lp], dim=1)
    return src_mask


def _open(ext: Extensions) -> Extensions:
    """The K best non-EOS extensions of each sentence, which stay open, in rank order (a stable
    sort): scores (n, K) float32 log P, rows (n*K,) int64 the rows they extend, tokens and
    token_lp (n*K, 1) the new tokens and their log-probabilities."""
    K = ext.tokens.size(1) // 2
    order = torch.argsort((ext.tokens == EOS_ID).to(torch.int8), dim=1, stable=True)[:, :K]  # (n, K)
    return Extensions(ext.scores.gather(1, order), ext.rows.gather(1, order).view(-1),
                      ext.tokens.gather(1, order).view(-1, 1), ext.token_lp.gather(1, order).view(-1, 1))


@torch.no_grad()
def beam_search(model: StepModel, src: torch.Tensor, options: SearchOptions) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences; each step selects (:func:`_select`), finishes
    (:func:`_finish`) and prunes (:func:`_prune`).

    Args:
        model: a step model (``attnmt.search.step_model``), e.g. a Transformer in eval mode.
        src: (B, S) int64 source ids ending with EOS, right-padded.
        options: the search (``attnmt.search.options.SearchOptions``): K = ``beam_size``, the
            ``nbest`` returned, the ranking (``SearchOptions.score``), the length limit, the
            stopping rule (module docstring), and
            ``constraints``: None, or one entry per sentence: the phrases (target token-id
            sequences) its output must contain (``attnmt.search.constraints``: dynamic beam
            allocation). Sentences without phrases are searched exactly as without
            constraints; a sentence whose phrases cannot fit its length limit is searched
            without them (a warning).
            ``on_step``: streaming: after every step, called for each sentence still searched
            with its batch index and its *settled* tokens, the longest prefix shared by all its
            live beams and finished hypotheses (every hypothesis the search can still return
            starts with it). Returning True stops that sentence's search (its result is then
            meaningless), e.g. when nobody waits for it any more.
            ``return_attention`` is not handled here.
    Returns:
        For each sentence, in input order, ``nbest`` :class:`Hypothesis` sorted best first
        (always ``nbest``: ``SearchOptions.best``).
    Raises:
        ValueError: a vocabulary smaller than 2 * beam_size, or constraints that do not match
            the batch or hold special ids.
    """
    wanted, on_step = options.finished_wanted, options.on_step
    memory, src_mask, _ = model.encode(src)  # (B, S, D), (B, 1, 1, S): one row per sentence
    limits = max_output_lengths(src, model.pad_id, options.max_len_a, options.max_len_b,
                                model.config.max_positions - 1).tolist()
    constraint = (ConstraintTracker(options.constraints, options.beam_size, limits)
                  if options.constraints is not None else _NoConstraints())
    cache = model.init_cache()
    beams = _Beams.start(src.size(0), src.device, model.config.decoder_start_id)
    finished: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    t = 0
    while beams.active:
        logp = model.decode_step(beams.history[:, -1:], memory, src_mask, cache)  # (n*k, V), k = 1 at first
        memory = None  # from now on the cache holds the source keys/values
        ext, cut = _select(beams, logp, limits, t, options, constraint)
        t += 1
        _finish(ext, beams, finished, options.score, cut)
        opened = _open(ext)
        best_open = opened.scores.max(dim=1).values.tolist()  # (n,)
        keep = [i for i, sent in enumerate(beams.active)
                if not _is_done(finished[sent], best_open[i], t, limits[sent], options.nbest, options.score, wanted)]
        if on_step is not None:  # streaming: report each kept sentence's settled tokens; True stops it
            keep = [i for i in keep if not on_step(beams.active[i], settled_prefix(
                beams.history, opened.rows, opened.tokens, opened.scores[i], i, finished[beams.active[i]]))]
        src_mask = _prune(opened, beams, keep, src_mask, cache, constraint)
    return [options.best(f) for f in finished]


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

