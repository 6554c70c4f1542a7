"""Word alignments from encoder-decoder attention, as Moses-style ``i-j`` pairs.

Attention links subwords; users want words. A *word* here is a whitespace-separated word of the
detokenised text: of the source sentence as the tokenizer normalises it, and of the
translation as printed. :func:`word_ids` finds the word of every subword by decoding growing
prefixes, so it holds for any tokenizer (SentencePiece's word-initial ``▁``, or a word-level
tokenizer whose detokeniser glues punctuation to the word before it).

Aggregation (:func:`align_words`): from one decoder layer's source attention averaged over its
heads, a (T, S) matrix over subwords without EOS, the word-level matrix is

    A[v, u] = mean over the target subwords t of word v of  sum over the source subwords s of word u  of a[t, s]

(the attention mass each source word receives, averaged over the target word's subwords); each
target word is aligned to its argmax source word, so every target word gets exactly one link.
The source EOS column is left out (attention parks there when no source word is needed) and so
is the target EOS row. Garg et al. (2019, "Jointly Learning to Align and Translate with
Transformer Models", section 3) found a single layer's head-averaged attention a fair aligner,
the penultimate layer the best of their 6-layer models; ``attnmt.config.DEFAULT_ALIGNMENT_LAYER``
is the layer chosen on hand-checked Multi30k sentences (docs/control.md). :func:`align_translation`
aligns every hypothesis of a translation, the best from the attention its search returned, the
others from forced decoding.

Shapes: T target subwords, S source subwords (EOS excluded after slicing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from attnmt.config import DEFAULT_ALIGNMENT_LAYER
from attnmt.data.tokenizers import EOS_ID

if TYPE_CHECKING:  # only the native engine gives attention: the others run without PyTorch
    import torch

    from attnmt.decode.results import Translation


def word_ids(ids: Sequence[int], decode: Callable[[list[int]], str]) -> list[int]:
    """The 0-based index of the word each token belongs to.

    Args:
        ids: token ids without EOS.
        decode: the tokenizer's ids -> text (e.g. ``Tokenizer.decode``).
    Returns:
        One non-decreasing index per id; token k belongs to word ``len(decode(ids[:k+1]).split()) - 1``
        (at least 0, and never below the previous token's).
    """
    out, last = [], 0
    for k in range(len(ids)):
        last = max(last, len(decode(list(ids[:k + 1])).split()) - 1)
        out.append(last)
    return out


def align_words(attention: torch.Tensor, src_words: Sequence[int], tgt_words: Sequence[int]) -> list[tuple[int, int]]:
    """Word alignment pairs (source word, target word) from subword attention (module docstring).

    Args:
        attention: (T', S') float attention of one layer averaged over heads, T' >= len(tgt_words)
            rows (target subwords, maybe then EOS) and S' >= len(src_words) columns (source
            subwords, maybe then EOS); rows and columns past the words are ignored.
        src_words, tgt_words: the word index of each source / target subword (:func:`word_ids`).
    Returns:
        One (i, j) pair per target word j that has subwords, sorted by j; i indexes the source
        words. Empty when either side has no words.
    Raises:
        ValueError: attention smaller than the word lists.
    """
    import torch

    if not src_words or not tgt_words:
        return []
    T, S = len(tgt_words), len(src_words)
    if attention.size(0) < T or attention.size(1) < S:
        raise ValueError(f"attention {tuple(attention.shape)} is smaller than {T} target x {S} source subwords")
    a = attention[:T, :S].float().cpu()  # (T, S)
    n_src, n_tgt = src_words[-1] + 1, tgt_words[-1] + 1
    src_map = torch.zeros(S, n_src).index_put_((torch.arange(S), torch.tensor(list(src_words))), torch.tensor(1.0))
    tgt_map = torch.zeros(n_tgt, T).index_put_((torch.tensor(list(tgt_words)), torch.arange(T)), torch.tensor(1.0))
    counts = tgt_map.sum(dim=1, keepdim=True)  # (target words, 1) subwords per word
    words = (tgt_map / counts.clamp(min=1.0)) @ a @ src_map  # (target words, source words): mean of sums
    return [(i, j) for j, (i, n) in enumerate(zip(words.argmax(dim=1).tolist(), counts[:, 0].tolist())) if n > 0]


def alignment_layer(layer: int | None, num_layers: int) -> int:
    """The decoder layer (1-based) whose source attention aligns words: ``layer``, or by default
    ``attnmt.config.DEFAULT_ALIGNMENT_LAYER`` (at most ``num_layers``).

    Raises:
        ValueError: a layer outside 1..num_layers.
    """
    layer = min(DEFAULT_ALIGNMENT_LAYER, num_layers) if layer is None else layer
    if not 1 <= layer <= num_layers:
        raise ValueError(f"the alignment layer must be between 1 and {num_layers}, got {layer}")
    return layer


def align_translation(translation: Translation, src_ids: list[int], layer: int, tagged: int,
                      src_decode: Callable[[list[int]], str], tgt_decode: Callable[[list[int]], str],
                      source_attention: Callable[[list[int], list[int]], torch.Tensor]) -> None:
    """Fill each hypothesis' ``alignment`` from decoder layer ``layer`` (1-based), its heads
    averaged (:func:`align_words`): the best hypothesis' attention from ``translation.attention``
    when the engine returned it, the others' from ``source_attention(src_ids, token_ids)``
    (forced decoding, (L, H, T, S)). An engine whose search returns one layer, (1, H, T, S)
    (CTranslate2: its export's alignment layer), is aligned by that layer whatever ``layer``.

    Args:
        src_ids: the sentence's source ids, ending with EOS.
        tagged: how many ids in front are a language tag (not words of the source).
        src_decode, tgt_decode: the source and target tokenizers' ids -> text.
    """
    src_words = word_ids(src_ids[tagged:-1], src_decode)
    for n, h in enumerate(translation.hypotheses):
        if n == 0 and translation.attention is not None:
            attention = translation.attention
        else:
            attention = source_attention(src_ids, h.token_ids)  # (L, H, T, S)
        attention = attention[..., tagged:]  # (L, H, T, S - tagged): the words only
        body = [t for t in h.token_ids if t != EOS_ID]
        one = attention[min(layer, attention.size(0)) - 1]  # (H, T, S)
        h.alignment = align_words(one.mean(dim=0), src_words, word_ids(body, tgt_decode))


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """Moses / fast_align format: ``"0-0 1-2 ..."`` (source-target, 0-based)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
