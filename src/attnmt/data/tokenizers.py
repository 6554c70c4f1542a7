"""Subword tokenization with SentencePiece (Kudo and Richardson, 2018), with fixed special ids.

Every vocabulary has the same special ids, so the model and search code can name them as
constants: PAD_ID 0, UNK_ID 1, BOS_ID 2, EOS_ID 3. A joint model (one vocabulary for source and
target, needed for shared embeddings) or separate source and target models are trained on the
training split and stored in the model directory as ``spm.model`` or ``src.spm.model`` and
``tgt.spm.model``.

Library: sentencepiece.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import sentencepiece as spm

from attnmt.errors import CheckpointError, DataError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """A SentencePiece model: raw text <-> ids (specials excluded from the output)."""

    def __init__(self, model_proto: bytes, name: str = "SentencePiece model"):
        self._proto = model_proto
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as e:  # SentencePiece's message for an unparsable model
            raise CheckpointError(f"{name}: not a SentencePiece model (empty, truncated or another format?): "
                                  f"{e}") from None
        if (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id()) != (
            PAD_ID, UNK_ID, BOS_ID, EOS_ID,
        ):
            raise CheckpointError(f"{name}: does not use attnmt's special ids (pad 0, unk 1, bos 2, eos 3)")

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model (what :meth:`save` writes; ``Tokenizer(proto)`` loads it)."""
        return self._proto

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """Load a ``.model`` file.

        Raises:
            CheckpointError: the file is missing, unreadable, or not a SentencePiece model.
        """
        try:
            return cls(Path(path).read_bytes(), str(path))
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such SentencePiece model") from None
        except OSError as e:
            raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None

    @classmethod
    def train(cls, sentences: list[str], vocab_size: int, model_type: str = "unigram",
              character_coverage: float = 1.0, max_sentences: int = 2_000_000, seed: int = 1) -> "Tokenizer":
        """Train a SentencePiece model on raw sentences (empty ones skipped).

        If the text cannot support ``vocab_size`` pieces, SentencePiece's hard limit is lowered
        to what it allows (``hard_vocab_limit=False``).

        Raises:
            DataError: no non-empty sentence, or SentencePiece cannot train on the text (its
                message, e.g. a vocabulary smaller than the characters to cover).
        """
        sentences = [s for s in sentences if s.strip()]
        if not sentences:
            raise DataError("no non-empty sentence to train the SentencePiece model on")
        if len(sentences) > max_sentences:
            sentences = random.Random(seed).sample(sentences, max_sentences)
        buf = io.BytesIO()
        try:
            cls._train_into(buf, sentences, vocab_size, model_type, character_coverage)
        except RuntimeError as e:
            raise DataError(f"cannot train the SentencePiece model: {e}") from None
        return cls(buf.getvalue())

    @staticmethod
    def _train_into(buf: io.BytesIO, sentences: list[str], vocab_size: int, model_type: str,
                    character_coverage: float) -> None:
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
