"""Lexically constrained beam search: dynamic beam allocation (Post & Vilar, NAACL 2018).

Each sentence may carry positive constraints: phrases (target token-id sequences) that its
output must contain. Beam search (``attnmt.search.beam``) asks this module three things at
every step; nothing else of the search changes:

1. :meth:`ConstraintTracker.mask_eos`: a hypothesis may end (EOS) only once every one of its
   sentence's phrases has been produced.
2. :meth:`ConstraintTracker.reorder`: the candidates of a constrained sentence. To the 2K best
   one-token extensions of its beams (as in plain beam search) it adds, for every live beam, its
   single best next token and each token that advances an unmet phrase (the next token of the
   phrase in progress, the first token of every other unmet phrase). Each candidate falls in a
   *bank*: the number of constraint tokens it has met (a phrase in progress counts its matched
   tokens). Candidates that can no longer meet their phrases before the sentence's length
   limit (``t + unmet tokens + EOS > limit``) are dropped. The beam is then allocated across
   banks: slots are dealt round-robin, the bank with the most constraint tokens met first and
   the best score first within a bank; a bank with fewer candidates leaves its turns to the
   others (Post & Vilar's allocation of ``K / (C + 1)`` slots per bank with the unused slots
   redistributed, in the striped form of fairseq's ``LexicallyConstrainedBeamSearch``). The
   resulting order replaces the score order, and beam search proceeds as usual: EOS candidates
   among the first K finish, the first K others stay open.
3. :meth:`ConstraintTracker.advance`: each open beam's constraint state after its new token.

Tracking: at most one phrase is in progress per hypothesis. A token that continues it advances
it; a token that does not abandons it (its matched tokens are un-met again), and the longest
suffix of the abandoned tokens plus the new one that begins an unmet phrase becomes the new
phrase in progress (so ``a a b`` is found in ``a a a b``). A phrase is met when its last token
is produced, and stays met.

Sentences without phrases keep the plain beam search order untouched, so their output equals
unconstrained beam search exactly. A sentence whose phrases need more tokens than its length
limit allows (all constraint tokens + EOS > limit) cannot be satisfied: it is decoded without
its constraints and a warning names it (:func:`constraints_fit` lets callers check first).

Shapes: n sentences still searched, K beam size, V vocabulary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnmt.errors import OptionError
from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:  # tensors come from the native search; the phrase checks serve every engine
    import torch

log = logging.getLogger(__name__)

Phrases = Sequence[Sequence[int]]


@dataclass(frozen=True)
class ConstraintState:
    """How far one hypothesis has got with its sentence's phrases.

    met: one flag per phrase. phrase: the index of the phrase in progress (-1 for none).
    progress: how many of its tokens the hypothesis has just produced.
    """

    met: tuple[bool, ...]
    phrase: int = -1
    progress: int = 0

    @classmethod
    def start(cls, num_phrases: int) -> "ConstraintState":
        return cls((False,) * num_phrases)


def check_phrases(phrases: Phrases) -> list[list[int]]:
    """``phrases`` as lists, empty ones dropped.

    Raises:
        ValueError: a phrase holding a special id (PAD, BOS, EOS).
    """
    out = [list(p) for p in phrases if len(p)]
    for p in out:
        if any(t in (PAD_ID, BOS_ID, EOS_ID) for t in p):
            raise OptionError(f"a constraint phrase holds a special token id: {p}")
    return out


def constraints_fit(phrases: Phrases, limit: int) -> bool:
    """Whether an output of at most ``limit`` tokens (EOS included) can hold every phrase:
    the sum of their lengths + 1 <= limit."""
    return sum(len(p) for p in phrases) + 1 <= limit


def met_tokens(phrases: Phrases, state: ConstraintState) -> int:
    """The constraint tokens a hypothesis has met: all tokens of its met phrases, plus the
    matched tokens of the phrase in progress (its bank)."""
    return sum(len(p) for p, m in zip(phrases, state.met) if m) + state.progress


def advance(phrases: Phrases, state: ConstraintState, token: int) -> ConstraintState:
    """The state after producing ``token`` (module docstring, 'Tracking')."""
    if state.phrase >= 0 and phrases[state.phrase][state.progress] == token:
        progress = state.progress + 1
        if progress == len(phrases[state.phrase]):
            met = list(state.met)
            met[state.phrase] = True
            return ConstraintState(tuple(met))
        return ConstraintState(state.met, state.phrase, progress)
    tail = (list(phrases[state.phrase][:state.progress]) if state.phrase >= 0 else []) + [token]
    for start in range(len(tail)):  # the longest suffix of ``tail`` that begins an unmet phrase
        suffix = tail[start:]
        for q, phrase in enumerate(phrases):
            if not state.met[q] and list(phrase[:len(suffix)]) == suffix:
                if len(suffix) == len(phrase):
                    met = list(state.met)
                    met[q] = True
                    return ConstraintState(tuple(met))
                return ConstraintState(state.met, q, len(suffix))
    return ConstraintState(state.met)


def next_tokens(phrases: Phrases, state: ConstraintState) -> set[int]:
    """The tokens that advance an unmet phrase: the next one of the phrase in progress and the
    first one of each other unmet phrase."""
    tokens = {phrases[state.phrase][state.progress]} if state.phrase >= 0 else set()
    tokens.update(p[0] for q, p in enumerate(phrases) if not state.met[q] and q != state.phrase)
    return tokens


def round_robin(banks: list[int], scores: list[float]) -> list[int]:
    """Candidate indices in dynamic beam allocation order: the best of each bank (most tokens
    met first), then the second best of each, and so on.

    Args:
        banks: each candidate's bank (constraint tokens met).
        scores: each candidate's log-probability.
    """
    order = sorted(range(len(banks)), key=lambda c: (-banks[c], -scores[c]))
    rank = [0] * len(banks)
    seen = 0  # candidates of the current bank before this one
    last = None  # the bank of the previous candidate
    for c in order:  # rank within its bank
        seen = seen + 1 if banks[c] == last else 0
        last = banks[c]
        rank[c] = seen
    return sorted(order, key=lambda c: (rank[c], -banks[c]))


class ConstraintTracker:
    """The constraint state of every open beam of a beam search (module docstring).

    Args:
        constraints: one entry per sentence of the batch: its phrases (token-id sequences, none
            holding PAD, BOS or EOS), possibly none.
        beam_size: K.
        limits: each sentence's output length limit in tokens, EOS included.
    Raises:
        ValueError: a phrase with a special id, or a constraint list per sentence that does not
            match the batch.
    """

    def __init__(self, constraints: Sequence[Phrases], beam_size: int, limits: list[int]):
        if len(constraints) != len(limits):
            raise ValueError(f"{len(constraints)} constraint lists for {len(limits)} sentences")
        self.phrases: list[list[list[int]]] = []
        for s, (phrases, limit) in enumerate(zip(constraints, limits)):
            phrases = check_phrases(phrases)
            if phrases and not constraints_fit(phrases, limit):
                log.warning("sentence %d: its constraints need %d tokens + EOS but its output limit is %d tokens; "
                            "decoded without them", s + 1, sum(map(len, phrases)), limit)
                phrases = []
            self.phrases.append(phrases)
        self.beam_size = beam_size
        self.limits = limits
        self.states = [ConstraintState.start(len(p)) for p in self.phrases]  # one beam per sentence at the start

    def any(self, active: list[int]) -> bool:
        """Whether a sentence still searched has phrases."""
        return any(self.phrases[s] for s in active)

    def mask_eos(self, logp: torch.Tensor, active: list[int]) -> torch.Tensor:
        """``logp`` (n*k, V) with EOS at -inf (in place) for the beams whose phrases are not all met
        (k beams per sentence: 1 at the first step, then K).

        Args:
            active: the sentence (batch index) of each of the n sentences searched.
        """
        k = logp.size(0) // len(active)
        unmet = [r for r, state in enumerate(self.states)
                 if self.phrases[active[r // k]] and not all(state.met)]
        if unmet:
            logp[unmet, EOS_ID] = float("-inf")
        return logp

    def reorder(self, scores: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, token_lp: torch.Tensor,
                beam_scores: torch.Tensor, logp: torch.Tensor, active: list[int], t: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The candidates of each constrained sentence in dynamic beam allocation order.

        Args:
            scores, rows, tokens, token_lp: (n, 2K) the 2K best extensions of each sentence (as
                ``attnmt.search.beam.Extensions``: log P of the extended prefix, the beam row
                (of n*k) it extends, the new token, its log-probability), best first.
            beam_scores: (n, k) float32 log P of the open beams (-inf for dead ones); k = 1 at
                the first step, then K.
            logp: (n*k, V) next-token log-probabilities (EOS already masked, :meth:`mask_eos`).
            active: the batch index of each of the n sentences.
            t: tokens generated once these candidates are taken.
        Returns:
            The four (n, 2K) tensors; rows of unconstrained sentences unchanged, the others'
            padded with -inf candidates.
        """
        k, width = beam_scores.size(1), scores.size(1)  # k open beams per sentence now
        out = [x.clone() for x in (scores, rows, tokens, token_lp)]
        flat_scores = beam_scores.reshape(-1)  # (n*k,)
        for i, sent in enumerate(active):
            phrases = self.phrases[sent]
            if not phrases:
                continue
            limit = self.limits[sent]
            cands: dict[tuple[int, int], tuple[float, float]] = {}
            for s, r, tok, lp in zip(scores[i].tolist(), rows[i].tolist(), tokens[i].tolist(), token_lp[i].tolist()):
                if math.isfinite(s):
                    cands[(r, tok)] = (s, lp)
            live = [b for b in range(k) if math.isfinite(flat_scores[i * k + b].item())]
            if t < limit:
                block = logp[i * k:(i + 1) * k].float().clone()  # (k, V)
                block[:, EOS_ID] = float("-inf")
                best = block.argmax(dim=-1).tolist()  # (k,)
                extra = [(i * k + b, tok) for b in live
                         for tok in {best[b]} | next_tokens(phrases, self.states[i * k + b])
                         if (i * k + b, tok) not in cands]
            else:  # at the limit only EOS fits after the phrases: each beam's EOS (-inf where unmet)
                extra = [(i * k + b, EOS_ID) for b in live if (i * k + b, EOS_ID) not in cands]
            if extra:
                er = rows.new_tensor([r for r, _ in extra])  # int64, on the search's device
                et = rows.new_tensor([tok for _, tok in extra])
                elp = logp[er, et].float()
                es = flat_scores[er] + elp
                for (r, tok), s, lp in zip(extra, es.tolist(), elp.tolist()):
                    if math.isfinite(s):
                        cands[(r, tok)] = (s, lp)
            total = sum(map(len, phrases))
            keys = []
            banks = []
            values = []
            for (r, tok), (s, lp) in cands.items():
                state = self.states[r] if tok == EOS_ID else advance(phrases, self.states[r], tok)
                met = met_tokens(phrases, state)
                if tok != EOS_ID and t + (total - met) + 1 > limit:
                    continue  # its phrases no longer fit before the limit
                keys.append((r, tok))
                banks.append(met)
                values.append((s, lp))
            chosen = round_robin(banks, [v[0] for v in values])[:width]
            pad = width - len(chosen)
            row_s = [values[c][0] for c in chosen] + [float("-inf")] * pad
            row_r = [keys[c][0] for c in chosen] + [i * k] * pad
            row_t = [keys[c][1] for c in chosen] + [PAD_ID] * pad
            row_lp = [values[c][1] for c in chosen] + [float("-inf")] * pad
            for x, values_i in zip(out, (row_s, row_r, row_t, row_lp)):
                x[i] = x.new_tensor(values_i)
        return out[0], out[1], out[2], out[3]

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor, active: list[int]) -> None:
        """Follow the beams: new row j extends old row ``rows[j]`` with ``tokens[j]``.

        Args:
            rows: (n'*K,) int64 old beam rows. tokens: (n'*K,) int64 new tokens.
            active: the batch index of each of the n' sentences searched from now on.
        """
        K = self.beam_size
        self.states = [advance(self.phrases[active[j // K]], self.states[r], tok) if self.phrases[active[j // K]]
                       else self.states[r] for j, (r, tok) in enumerate(zip(rows.tolist(), tokens.tolist()))]
