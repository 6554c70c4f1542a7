"""Subword tokenization with SentencePiece (Kudo and Richardson, 2018), with fixed special ids.

Every vocabulary has the same special ids, so the model and search code can name them as
constants: PAD_ID 0, UNK_ID 1, BOS_ID 2, EOS_ID 3. A joint model (one vocabulary for source and
target, needed for shared embeddings) or separate source and target models are trained on the
training split and stored in the model directory as ``spm.model`` or ``src.spm.model`` and
``tgt.spm.model``.

An imported MarianMT model brings its own kind (:class:`VocabTokenizer`): separate source and
target SentencePiece models whose pieces are looked up in one shared vocabulary (``vocab.json``),
reordered on import so that the special ids above hold.

Library: sentencepiece.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import sentencepiece as spm

from attnmt.errors import CheckpointError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """A SentencePiece model: raw text <-> ids (specials excluded from the output)."""

    def __init__(self, model_proto: bytes):
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
            PAD_ID, UNK_ID, BOS_ID, EOS_ID,
        ):
            raise CheckpointError("SentencePiece model does not use attnmt's special ids (pad 0, unk 1, bos 2, eos 3)")

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load a ``.model`` file. Raises CheckpointError if it is missing."""
        try:
            return cls(Path(path).read_bytes())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such SentencePiece model") from None

    @classmethod
    def train(cls, sentences: list[str], vocab_size: int, model_type: str = "unigram",
              character_coverage: float = 1.0, max_sentences: int = 2_000_000, seed: int = 1) -> "Tokenizer":
        """Train a SentencePiece model on raw sentences (empty ones skipped).

        If the text cannot support ``vocab_size`` pieces, SentencePiece's hard limit is lowered
        to what it allows (``hard_vocab_limit=False``).
        """
        sentences = [s for s in sentences if s.strip()]
        if len(sentences) > max_sentences:
            sentences = random.Random(seed).sample(sentences, max_sentences)
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            hard_vocab_limit=False,
            num_threads=2,
            minloglevel=2,
        )
        return cls(buf.getvalue())

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self._proto)

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Subword ids of raw text, without BOS/EOS."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts, out_type=int, num_threads=2)

    def decode(self, ids: list[int]) -> str:
        """Raw (detokenized) text of subword ids; special ids are dropped."""
        return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        """The subword strings of ids (e.g. '▁Mann'), for display."""
        return [self._sp.id_to_piece(i) for i in ids]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        """The ids of subword strings (UNK_ID for unknown ones): the inverse of :meth:`pieces`."""
        return [self._sp.piece_to_id(p) for p in pieces]


class VocabTokenizer(Tokenizer):
    """SentencePiece pieces mapped to ids by a separate vocabulary, MarianMT's layout (one shared
    vocabulary for a source and a target SentencePiece model).

    Args:
        model_proto: the SentencePiece model (its own ids are not used).
        vocab: the piece of every id, ``vocab[PAD_ID] == '<pad>'``, ``vocab[UNK_ID]`` the unknown
            piece and ``vocab[EOS_ID] == '</s>'``; BOS_ID may be an ordinary piece (MarianMT has no
            BOS). Pieces missing from the vocabulary encode to UNK_ID.
    """

    def __init__(self, model_proto: bytes, vocab: list[str]):
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self.vocab = list(vocab)
        self._ids = {piece: i for i, piece in enumerate(self.vocab)}

    @classmethod
    def load_with_vocab(cls, path: str | Path, vocab: list[str]) -> "VocabTokenizer":
        """Load a ``.model`` (or MarianMT ``.spm``) file. Raises CheckpointError if it is missing."""
        try:
            return cls(Path(path).read_bytes(), vocab)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such SentencePiece model") from None

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Vocabulary ids of the pieces of raw text, without EOS."""
        return [self._ids.get(p, UNK_ID) for p in self._sp.encode(text, out_type=str)]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[self._ids.get(p, UNK_ID) for p in pieces]
                for pieces in self._sp.encode(texts, out_type=str, num_threads=2)]

    def decode(self, ids: list[int]) -> str:
        """Raw text of vocabulary ids; PAD and EOS are dropped (BOS_ID is an ordinary piece here)."""
        return self._sp.decode_pieces([self.vocab[i] for i in ids if i not in (PAD_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.vocab[i] for i in ids]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self._ids.get(p, UNK_ID) for p in pieces]
