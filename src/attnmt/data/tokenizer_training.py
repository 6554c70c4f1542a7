"""Training the tokenizers of a preparation on its sample (``attnmt.data.sampling``) and saving
them in a model directory's layout.

SentencePiece models (one joint model, or one a side; a multilingual model's one model with its
language tags reserved, ``attnmt.languages``) or word vocabularies (``tokenizer.kind word``,
spaCy's rule-based tokenizer, optionally only words with a vector).

Library: sentencepiece and spaCy (through ``attnmt.data.tokenizers``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from attnmt import languages
from attnmt.config import Config
from attnmt.data.corpus import sha256_file
from attnmt.data.tokenizers import Tokenizer, VocabTokenizer, WordTokenizer
from attnmt.data.vectors import vec_words
from attnmt.errors import write_error

log = logging.getLogger(__name__)


def train_tokenizers(config: Config, src_lines: list[str], tgt_lines: list[str]
                     ) -> tuple[Tokenizer | WordTokenizer, Tokenizer | WordTokenizer]:
    """SentencePiece model(s), or word vocabularies (``tokenizer.kind word``), trained on the
    given lines; a joint model is one object for both sides.

    Raises:
        DataError: no non-empty line, or SentencePiece cannot train on the text.
    """
    tc = config.tokenizer  # a multilingual one is joint SentencePiece (attnmt.config.rules.language_rules)
    if tc.kind == "word":
        return _train_word_tokenizers(config, src_lines, tgt_lines)
    options = dict(vocab_size=tc.vocab_size, model_type=tc.model_type, character_coverage=tc.character_coverage,
                   max_sentences=tc.max_sentences, seed=config.train.seed)
    if tc.target_languages:  # multilingual: one model over every language, the tags reserved
        log.info("training a joint SentencePiece %s model (%d pieces) with the tags %s", tc.model_type,
                 tc.vocab_size, " ".join(languages.tags(config)))
        tok = Tokenizer.train(src_lines + tgt_lines, **options, user_symbols=languages.tags(config))
        return tok, tok
    if tc.joint:
        log.info("training a joint SentencePiece %s model (%d pieces)", tc.model_type, tc.vocab_size)
        tok = Tokenizer.train(src_lines + tgt_lines, **options)
        return tok, tok
    log.info("training source and target SentencePiece %s models (%d pieces each)", tc.model_type, tc.vocab_size)
    return Tokenizer.train(src_lines, **options), Tokenizer.train(tgt_lines, **options)


def _train_word_tokenizers(config: Config, src_lines: list[str], tgt_lines: list[str]
                           ) -> tuple[WordTokenizer, WordTokenizer]:
    """Word vocabularies of each side (tokenizer.kind word); with ``require_vectors`` only words
    that have a vector in ``model.src_vectors`` / ``model.tgt_vectors``."""
    tc = config.tokenizer
    mc = config.model
    options = dict(lowercase=tc.lowercase, min_freq=tc.min_freq, max_vocab=tc.max_vocab, token_filter=tc.token_filter)
    src_lang, tgt_lang = config.languages()
    src_allowed = vec_words(mc.src_vectors) if tc.require_vectors else None
    tgt_allowed = vec_words(mc.tgt_vectors) if tc.require_vectors else None
    log.info("building word vocabularies (%s, %s) with spaCy's rule-based tokenizer", src_lang, tgt_lang)
    return (WordTokenizer.train(src_lines, src_lang, allowed=src_allowed, **options),
            WordTokenizer.train(tgt_lines, tgt_lang, allowed=tgt_allowed, **options))


def save_tokenizers(directory: Path, src, tgt) -> dict[str, str]:
    """Write the tokenizers in a model directory's layout (``attnmt.rundir.read_tokenizers``
    reads them): ``spm.model`` for a joint model, else ``src.`` and ``tgt.`` files, plus
    ``vocab.json`` for a MarianMT vocabulary. Returns each file's SHA-256.

    Raises:
        WriteError: a file cannot be written (named).
    """
    writes = [(src.FILE, src)] if src is tgt and not isinstance(src, VocabTokenizer) else [
        (f"src.{src.FILE}", src), (f"tgt.{tgt.FILE}", tgt)]
    for name, tok in writes:
        try:
            tok.save(directory / name)
            if isinstance(tok, VocabTokenizer) and name.startswith("src."):
                (directory / "vocab.json").write_text(json.dumps(tok.vocab, ensure_ascii=False), encoding="utf-8")
        except OSError as e:
            raise write_error(f"{directory / name}: cannot write: {e.strerror}", e) from None
    names = ("spm.model", "src.spm.model", "tgt.spm.model", "vocab.json", "src.vocab.json", "tgt.vocab.json")
    return {n: sha256_file(directory / n) for n in names if (directory / n).is_file()}
