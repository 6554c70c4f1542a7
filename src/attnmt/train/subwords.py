"""Subword regularisation: training batches whose sentences get a new segmentation each time.

Kudo (2018), "Subword Regularization: Improving Neural Network Translation Models with Multiple
Subword Candidates", section 3: instead of the one best segmentation of a sentence, train on
segmentations sampled from the unigram language model, P(x | X) proportional to P(x)^alpha, among
the l best segmentations or all of them (forward-filtering and backward-sampling). For a BPE
model SentencePiece's sampling is BPE-dropout (Provilkov et al., 2020): each merge is skipped with
probability alpha. ``train.subword_alpha`` (and ``train.subword_nbest``) switch it on; off, the
batches are the prepared segmentation, untouched.

The prepared data holds one segmentation per sentence. :class:`SubwordSampler` turns each row of
a batch back into text (SentencePiece's decode, which the prepared segmentation round-trips) and
encodes it again with sampling, just before the batch's tensors are made; validation and
translation keep the one best segmentation. The draws come from SentencePiece's generator,
seeded for every batch from the run's seed, the epoch, the batch's index and the process's rank,
so a run resumed in the middle of an epoch samples what the uninterrupted run would have.

Library: sentencepiece (its sampling), numpy (``SeedSequence`` for the per-batch seeds).
"""

from __future__ import annotations

import numpy as np
import sentencepiece as spm

from attnmt.data.tokenizers import Tokenizer
from attnmt.errors import ConfigError


class SubwordSampler:
    """Re-segment the rows of a batch (module docstring).

    Args:
        src_tok, tgt_tok: the run's SentencePiece tokenizers (one object when joint).
        alpha: ``train.subword_alpha``. nbest: ``train.subword_nbest``. seed: ``train.seed``.
    Raises:
        ConfigError: a tokenizer that is not a plain SentencePiece model (word-level, or an
            imported model's own vocabulary): a check of the files the run holds; the rules
            between keys (no sampling for a multilingual model or word vocabularies) are
            ``attnmt.config.rules``'.
    """

    def __init__(self, src_tok, tgt_tok, alpha: float, nbest: int, seed: int):
        if not all(type(t) is Tokenizer for t in (src_tok, tgt_tok)):
            raise ConfigError("train.subword_alpha needs attnmt's own SentencePiece tokenizers (not word-level ones "
                              "or an imported model's vocabulary)")
        self.src_tok = src_tok
        self.tgt_tok = tgt_tok
        self.alpha = alpha
        self.nbest = nbest
        self.seed = seed

    def seed_for(self, epoch: int, batch: int, rank: int) -> int:
        """The generator's seed (uint32) for one batch of the run."""
        return int(np.random.SeedSequence([self.seed, epoch, batch, rank]).generate_state(1)[0])

    def __call__(self, src_rows: list[np.ndarray], tgt_rows: list[np.ndarray], epoch: int, batch: int, rank: int = 0
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The rows (token ids without EOS, as ``ShardedCorpus.pairs`` gives them) with a sampled
        segmentation each: source and target int64 id arrays."""
        spm.set_random_generator_seed(self.seed_for(epoch, batch, rank))
        src_text = [self.src_tok.decode(row.tolist()) for row in src_rows]
        tgt_text = [self.tgt_tok.decode(row.tolist()) for row in tgt_rows]
        if self.src_tok is self.tgt_tok:  # a joint vocabulary: one call, both sides
            both = self.src_tok.sample_batch(src_text + tgt_text, self.alpha, self.nbest)
            src, tgt = both[:len(src_text)], both[len(src_text):]
        else:
            src = self.src_tok.sample_batch(src_text, self.alpha, self.nbest)
            tgt = self.tgt_tok.sample_batch(tgt_text, self.alpha, self.nbest)
        return [np.array(ids, np.int64) for ids in src], [np.array(ids, np.int64) for ids in tgt]
