"""Subword tokenization with SentencePiece (Kudo and Richardson, 2018), and word-level
tokenization with spaCy, with fixed special ids.

Every vocabulary has the same special ids, so the model and search code can name them as
constants: PAD_ID 0, UNK_ID 1, BOS_ID 2, EOS_ID 3. A joint model (one vocabulary for source and
target, needed for shared embeddings) or separate source and target models are trained on the
training split and stored in the model directory as ``spm.model`` or ``src.spm.model`` and
``tgt.spm.model``.

:class:`WordTokenizer` splits text with spaCy's rule-based tokenizer for the language
(``spacy.blank(lang)``, no model download), optionally lowercases and filters the tokens, and
maps words outside its vocabulary to UNK_ID. Its output is detokenized with sacremoses'
``MosesDetokenizer``, so that sacreBLEU sees ordinary text. It is saved as JSON
(``src.vocab.json``, ``tgt.vocab.json``): the settings and the word list, nothing executable.

An imported MarianMT model brings its own kind (:class:`VocabTokenizer`): separate source and
target SentencePiece models whose pieces are looked up in one shared vocabulary (``vocab.json``),
reordered on import so that the special ids above hold.

User text never encodes to a reserved id. SentencePiece matches a model's
``user_defined_symbols`` (a multilingual model's language tags, ``<2fr>``) wherever they occur
in the text it encodes, so :meth:`Tokenizer.encode` runs a copy of the model in which they are
control symbols (as ``<s>``, ``</s>`` and ``<pad>`` are in every model): ``"<2fr> Ein Hund."`` is the
pieces of its characters, like any other text, on every path that tokenises text (translation,
scoring, serving, distillation, and training data preparation, which puts the tags in front
as ids, never as text). Word-level tokenizers map a word spelled like a special (``</s>``) to
UNK_ID, and an imported model's vocabulary receives only pieces its SentencePiece model knows.

Library: sentencepiece (and protobuf for its model schema); spaCy and sacremoses for word-level
tokenization (the ``word`` extra).
"""

from __future__ import annotations

import functools
import io
import json
import random
import re
from collections import Counter
from pathlib import Path

import sentencepiece as spm

from attnmt.config import LANGUAGE
from attnmt.errors import CheckpointError, ConfigError, DataError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]  # the word-level names of the special ids, in id order
KEEP_PUNCT = {".", ","}  # the non-alphabetic tokens that token_filter 'alpha_punct' keeps


def reserved_as_control(model_proto: bytes) -> bytes:
    """A serialized SentencePiece model whose user-defined symbols are control symbols: the same
    pieces, ids and scores, but none is matched in encoded text any more (SentencePiece matches
    user-defined symbols wherever they occur, never control symbols). Text without those
    symbols encodes exactly as with ``model_proto``.

    Library: protobuf, with SentencePiece's own schema (``sentencepiece_model_pb2``).

    Raises:
        google.protobuf.message.DecodeError: bytes that are not a SentencePiece model.
    """
    from sentencepiece import sentencepiece_model_pb2 as schema

    model = schema.ModelProto()
    model.ParseFromString(model_proto)
    for piece in model.pieces:
        if piece.type == schema.ModelProto.SentencePiece.USER_DEFINED:
            piece.type = schema.ModelProto.SentencePiece.CONTROL
    return model.SerializeToString()


def _text_processor(model_proto: bytes) -> spm.SentencePieceProcessor:
    """The processor that encodes user text (:func:`reserved_as_control` of ``model_proto``, a
    model SentencePiece has loaded already)."""
    return spm.SentencePieceProcessor(model_proto=reserved_as_control(model_proto))


class Tokenizer:
    """A SentencePiece model: raw text <-> ids (specials excluded from the output)."""

    FILE = "spm.model"  # file name in a model directory (with 'src.'/'tgt.' for separate models)
    threads = 2  # SentencePiece's threads in encode_batch (1 in attnmt prepare's worker processes, one a core)

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
        self._text_sp = _text_processor(model_proto)

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
              character_coverage: float = 1.0, max_sentences: int = 400_000, seed: int = 1,
              user_symbols: list[str] | None = None) -> "Tokenizer":
        """Train a SentencePiece model on raw sentences (empty ones skipped).

        ``user_symbols``: pieces reserved whole (SentencePiece's ``user_defined_symbols``): each
        is one piece of the vocabulary, put in front of sources as its id; a multilingual model's
        language tags (``attnmt.languages``). Text that spells one is encoded as its characters
        (:meth:`encode`). None or empty: none, the model of a plain bilingual run.

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
            cls._train_into(buf, sentences, vocab_size, model_type, character_coverage, user_symbols or [])
        except RuntimeError as e:
            raise DataError(f"cannot train the SentencePiece model: {e}") from None
        return cls(buf.getvalue())

    @staticmethod
    def _train_into(buf: io.BytesIO, sentences: list[str], vocab_size: int, model_type: str,
                    character_coverage: float, user_symbols: list[str]) -> None:
        extra = {"user_defined_symbols": user_symbols} if user_symbols else {}
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
            **extra,
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self._proto)

    def __len__(self) -> int:
        return self._sp.get_piece_size()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Subword ids of raw text, without BOS/EOS. Reserved pieces (language tags, ``</s>``)
        written in the text are ordinary characters here (module docstring)."""
        return self._text_sp.encode(text, out_type=int)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text (SentencePiece's ``threads`` threads)."""
        return self._text_sp.encode(texts, out_type=int, num_threads=self.threads)

    def sample_batch(self, texts: list[str], alpha: float, nbest: int = -1) -> list[list[int]]:
        """:meth:`encode_batch` with a segmentation of each text sampled by SentencePiece (subword
        regularisation, Kudo 2018: a unigram model samples P(x)^alpha among the ``nbest`` best
        segmentations, -1: all; a bpe model drops each merge with probability ``alpha``,
        Provilkov et al., 2020). The draws come from SentencePiece's generator in this thread,
        which ``sentencepiece.set_random_generator_seed`` makes repeatable."""
        return self._text_sp.encode(texts, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest,
                                    num_threads=1)

    def decode(self, ids: list[int]) -> str:
        """Raw (detokenized) text of subword ids; special ids are dropped."""
        return self._sp.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        """The subword strings of ids (e.g. '▁Mann'), for display."""
        return [self._sp.id_to_piece(i) for i in ids]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        """The ids of subword strings (UNK_ID for unknown ones): the inverse of :meth:`pieces`."""
        return [self._sp.piece_to_id(p) for p in pieces]


@functools.lru_cache(maxsize=8)
def _spacy_tokenizer(lang: str):
    """spaCy's rule-based tokenizer for ``lang`` (``spacy.blank(lang).tokenizer``), built once."""
    try:
        import spacy
    except ImportError:
        raise ConfigError("tokenizer.kind word needs spaCy: pip install 'attnmt[word]'") from None
    try:
        return spacy.blank(lang).tokenizer
    except ImportError:
        raise ConfigError(f"spaCy has no language {lang!r}") from None


@functools.lru_cache(maxsize=8)
def _detokenizer(lang: str):
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


class WordTokenizer:
    """Word-level tokenization: spaCy's rule-based tokens, a vocabulary, Moses detokenization.

    Args:
        words: the vocabulary after the specials (id 4 is ``words[0]``), no duplicates.
        lang: language code for spaCy and sacremoses (``de``, ``en``, ``fr``, ...).
        lowercase: lowercase every token.
        token_filter: 'none', or 'alpha_punct' to drop tokens that are not alphabetic, '.' or ','.
    """

    FILE = "vocab.json"

    def __init__(self, words: list[str], lang: str, lowercase: bool = False, token_filter: str = "none"):
        self.words = list(words)
        self.lang = lang
        self.lowercase = lowercase
        self.token_filter = token_filter
        self.itos = SPECIALS + self.words
        self.stoi = {w: i for i, w in enumerate(self.itos)}
        self._word_ids = {w: i for w, i in self.stoi.items() if i >= len(SPECIALS)}  # text never spells a special

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        """The (lowercased, filtered) word tokens of each text."""
        out = []
        for doc in _spacy_tokenizer(self.lang).pipe(texts, batch_size=1000):
            tokens = [t.text.lower() if self.lowercase else t.text for t in doc if not t.is_space]
            if self.token_filter == "alpha_punct":
                tokens = [t for t in tokens if t.isalpha() or t in KEEP_PUNCT]
            out.append(tokens)
        return out

    @classmethod
    def train(cls, sentences: list[str], lang: str, lowercase: bool = False, min_freq: int = 1,
              max_vocab: int | None = None, token_filter: str = "none",
              allowed: set[str] | None = None) -> "WordTokenizer":
        """Build the vocabulary: words seen at least ``min_freq`` times (and, if ``allowed`` is
        given, in it, e.g. the words with a pretrained vector), most frequent first (ties in
        alphabetical order), at most ``max_vocab`` of them."""
        probe = cls([], lang, lowercase, token_filter)
        counts = Counter(t for tokens in probe.tokenize(sentences) for t in tokens)
        ranked = sorted((w for w, n in counts.items() if n >= min_freq and w not in SPECIALS
                         and (allowed is None or w in allowed)), key=lambda w: (-counts[w], w))
        return cls(ranked[:max_vocab] if max_vocab else ranked, lang, lowercase, token_filter)

    def save(self, path: str | Path) -> None:
        data = {"kind": "word", "lang": self.lang, "lowercase": self.lowercase, "token_filter": self.token_filter,
                "words": self.words}
        Path(path).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "WordTokenizer":
        """Load a ``vocab.json`` written by :meth:`save`. Raises CheckpointError if it is
        missing or malformed."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            words = data["words"]
            lang = data["lang"]
            lowercase = data["lowercase"]
            token_filter = data["token_filter"]
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise ValueError(f"words {str(words)[:40]!r} is not a list of words")
            if not isinstance(lang, str) or not re.fullmatch(LANGUAGE, lang):
                raise ValueError(f"lang {lang!r} is not a language code")
            if not isinstance(lowercase, bool):
                raise ValueError(f"lowercase {lowercase!r} is not a boolean")
            if token_filter not in ("none", "alpha_punct"):
                raise ValueError(f"token_filter {token_filter!r} is not 'none' or 'alpha_punct'")
            return cls(words, lang, lowercase, token_filter)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such vocabulary") from None
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: not a word vocabulary: {e}") from None

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Word ids of raw text (UNK_ID for unknown words, and for a word spelled like a special
        such as ``</s>``), without BOS/EOS."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text."""
        return [[self._word_ids.get(t, UNK_ID) for t in tokens] for tokens in self.tokenize(texts)]

    def decode(self, ids: list[int]) -> str:
        """Detokenized text (sacremoses) of word ids; padding, BOS and EOS are dropped, UNK
        shows as '<unk>'."""
        return _detokenizer(self.lang).detokenize(
            [self.itos[i] for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        """The words of ids, for display."""
        return [self.itos[i] for i in ids]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        """The ids of words (UNK_ID for unknown ones): the inverse of :meth:`pieces`."""
        return [self.stoi.get(p, UNK_ID) for p in pieces]


class VocabTokenizer(Tokenizer):
    """SentencePiece pieces mapped to ids by a separate vocabulary, MarianMT's layout (one shared
    vocabulary for a source and a target SentencePiece model).

    Args:
        model_proto: the SentencePiece model (its own ids are not used).
        vocab: the piece of every id, ``vocab[PAD_ID] == '<pad>'``, ``vocab[UNK_ID]`` the unknown
            piece and ``vocab[EOS_ID] == '</s>'``; BOS_ID may be an ordinary piece (MarianMT has no
            BOS). Pieces missing from the vocabulary encode to UNK_ID, and so does text that
            SentencePiece leaves unknown but that spells a reserved entry of the vocabulary (its
            padding, unknown and end pieces, and OPUS-MT's language tags ``>>fra<<``).
    """

    def __init__(self, model_proto: bytes, vocab: list[str]):
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._text_sp = _text_processor(model_proto)
        self.vocab = list(vocab)
        reserved = {self.vocab[i] for i in (PAD_ID, UNK_ID, EOS_ID) if i < len(self.vocab)}
        reserved |= {p for p in self.vocab if p.startswith(">>") and p.endswith("<<") and len(p) > 4}
        self._ids = {piece: i for i, piece in enumerate(self.vocab)}
        self._text_ids = {piece: i for piece, i in self._ids.items() if piece not in reserved}

    @classmethod
    def load_with_vocab(cls, path: str | Path, vocab: list[str]) -> "VocabTokenizer":
        """Load a ``.model`` (or MarianMT ``.spm``) file. Raises CheckpointError if it is missing or
        not a SentencePiece model."""
        try:
            return cls(Path(path).read_bytes(), vocab)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such SentencePiece model") from None
        except RuntimeError as e:  # SentencePiece's message for an unparsable model, as in Tokenizer
            raise CheckpointError(f"{path}: not a SentencePiece model (empty, truncated or another format?): "
                                  f"{str(e).strip()}") from None

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """Vocabulary ids of the pieces of raw text, without EOS (never a reserved id: class
        docstring)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` of each text (SentencePiece's ``threads`` threads)."""
        return [[self._text_ids.get(p, UNK_ID) for p in pieces]
                for pieces in self._text_sp.encode(texts, out_type=str, num_threads=self.threads)]

    def decode(self, ids: list[int]) -> str:
        """Raw text of vocabulary ids; PAD and EOS are dropped (BOS_ID is an ordinary piece here)."""
        return self._sp.decode_pieces([self.vocab[i] for i in ids if i not in (PAD_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.vocab[i] for i in ids]

    def piece_ids(self, pieces: list[str]) -> list[int]:
        return [self._ids.get(p, UNK_ID) for p in pieces]
