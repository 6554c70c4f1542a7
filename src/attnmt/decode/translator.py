"""Raw text in, raw text out over any engine: tokenise, batch by length, search, detokenise.

``Translator`` ties the pieces a user should not have to assemble: the SentencePiece
model(s), an engine (``attnmt.decode.engine``: the native PyTorch model, or a CTranslate2 or
ONNX Runtime export), length-sorted batching (``attnmt.search.batched``), n-best lists and
detokenization. Empty input lines give empty translations, so output lines match input lines.
All of that happens here, once, whatever the engine; so do the controls over the output:
terminology constraints (``attnmt.decode.terminology``: checked and tokenised, then searched
by an engine that supports them), word alignments (``attnmt.decode.alignment``), confidence
(``attnmt.decode.confidence``) and streaming (a per-step callback). What it returns, the
scored hypotheses of each sentence, is ``attnmt.decode.results``; forced decoding of given
translations (:meth:`Translator.score`) is ``attnmt.decode.scoring``, documents
(:meth:`Translator.translate_document`) ``attnmt.decode.documents``.

Shapes: B batch, S source length, T output length, L layers, H heads.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from attnmt import languages
from attnmt.config import Config
from attnmt.data.tokenizers import EOS_ID, Tokenizer
from attnmt.decode.controls import OutputControls
from attnmt.decode.engine import Engine, SearchOptions, check_positions, check_supported, has_capability, require
from attnmt.decode.results import ScoredHypothesis, Translation, empty_translation, scored_hypothesis
from attnmt.decode.terminology import ConstraintError
from attnmt.search.batched import search_in_batches
from attnmt.search.hypothesis import Hypothesis

if TYPE_CHECKING:  # PyTorch is imported where the native engine is made: the others run without it
    import torch

    from attnmt.model.transformer import Transformer

log = logging.getLogger(__name__)

# The records a translation returns and the error it raises, importable from here with the Translator.
__all__ = ["ConstraintError", "ScoredHypothesis", "Translation", "Translator"]


class Translator(OutputControls):
    """Translate raw sentences with a model directory and an engine.

    Args:
        engine: an ``attnmt.decode.engine.Engine``; a ``Transformer`` is wrapped in a
            :class:`NativeEngine` (on ``device``, at ``config.decode.precision``).
        src_tokenizer, tgt_tokenizer, config: the model directory's (``attnmt.rundir``).
        device: for a ``Transformer`` only: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'
            (default ``config.decode.device``).
        precision: for a ``Transformer`` only: 'fp32', 'bf16', 'int8' or 'auto' (default
            ``config.decode.precision``; ``NativeEngine.set_precision``).

    Attribute ``inter_threads`` (default 1): batches searched at the same time, each by the
    engine in a thread of its own (``attnmt.search.batched.search_in_batches``); the engine's
    own threads are then per batch (``attnmt.interop.engines.open_translator`` sets both).

    Example:
        >>> tr = Translator.from_dir("runs/de-en")
        >>> tr.translate(["Ein Mann fährt Fahrrad."])[0].text
    """

    def __init__(self, engine: Engine | Transformer, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                 config: Config, device: str | None = None, precision: str | None = None):
        torch = sys.modules.get("torch")  # a Transformer exists only once PyTorch is imported
        if torch is not None and isinstance(engine, torch.nn.Module):  # the native engine over it
            from attnmt.decode.native import NativeEngine

            engine = NativeEngine(engine, device or config.decode.device, precision or config.decode.precision)
            if engine.torch_device.type != "cuda":  # on CUDA the fused kernel, else the config's
                engine.set_attention(config.decode.attention)
        self.engine = engine
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.config = config
        self.inter_threads = 1
        # The model (or export) directory it was loaded from, where its learned sentence splitter
        # is (``attnmt.data.sentence_model``, for documents); None: built from objects.
        self.directory: Path | None = None

    @classmethod
    def from_dir(cls, run_dir: str | Path, weights: str | Path | None = None, device: str | None = None,
                 precision: str | None = None) -> "Translator":
        """The native engine over a model directory (``attnmt.rundir``: config.yaml,
        SentencePiece model(s), model.safetensors).

        Args:
            weights: another safetensors file to load instead of the directory's model.safetensors.
            device: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'; default the config's ``decode.device``.
            precision: 'fp32', 'bf16', 'int8' or 'auto'; default the config's ``decode.precision``.
        Raises:
            CheckpointError, ConfigError: missing or incompatible files, or a device this
            machine does not have.
        """
        from attnmt.rundir import load_model_dir

        config, src_tok, tgt_tok, model = load_model_dir(run_dir, weights)
        tr = cls(model, src_tok, tgt_tok, config, device, precision)
        tr.directory = Path(run_dir)
        return tr

    # What only some engines have, each declared in ``engine.capabilities`` (attnmt.decode.engine).

    def _engine(self, capability: str, what: str):
        """The engine, once it is known to have ``capability`` (:func:`attnmt.decode.engine.require`)."""
        require(self.engine, capability, what)
        return self.engine

    @property
    def model(self) -> Transformer:
        """The PyTorch model (an engine with the 'torch_model' capability: native).

        Raises:
            UnsupportedOption: another engine.
        """
        return self._engine("torch_model", "a PyTorch model").model

    @property
    def device(self) -> torch.device:
        """Where the engine runs."""
        import torch

        return torch.device(self.engine.device)

    @property
    def precision(self) -> str:
        """The engine's precision, e.g. 'fp32', 'bf16', 'int8'."""
        return self.engine.precision

    @property
    def attention_kind(self) -> str | None:
        """The attention kernel ('explicit' or 'fused') of an engine that has a choice of kernel
        (capability 'attention_kernel'); None for the others."""
        return self.engine.attention_kind if has_capability(self.engine, "attention_kernel") else None

    def set_device(self, name: str) -> None:
        """``NativeEngine.set_device`` (capability 'device'). Raises UnsupportedOption for another engine."""
        self._engine("device", "--device after loading").set_device(name)

    def set_precision(self, precision: str) -> None:
        """``NativeEngine.set_precision`` (capability 'precision'). Raises UnsupportedOption for another engine."""
        self._engine("precision", "--precision").set_precision(precision)

    def set_attention(self, kind: str) -> None:
        """``NativeEngine.set_attention`` (capability 'attention_kernel'). Raises UnsupportedOption for another
        engine."""
        self._engine("attention_kernel", "--attention").set_attention(kind)

    def _hypothesis(self, h: Hypothesis) -> ScoredHypothesis:
        return scored_hypothesis(h, self.tgt_tokenizer)

    def encode_sources(self, sentences: list[str], tgt_lang: str | None = None) -> list[list[int]]:
        """Source ids + EOS per sentence, truncated to the model's max_positions; a multilingual
        model's start with the tag of ``tgt_lang`` (``attnmt.languages.source_prefix``).

        Raises:
            LanguageError: a multilingual model without ``tgt_lang``, or a language it does not know.
        """
        prefix = languages.source_prefix(self.config, self.src_tokenizer, tgt_lang)
        limit = self.config.model.max_positions - 1 - len(prefix)
        ids = self.src_tokenizer.encode_batch(sentences)
        for i, s in enumerate(ids):
            if len(s) > limit:
                log.warning("sentence %d has %d subwords; truncated to %d", i + 1, len(s), limit)
                ids[i] = s[:limit]
        return [prefix + s + [EOS_ID] for s in ids]

    def options(self, beam_size: int | None = None, nbest: int = 1, length_penalty: float | None = None,
                return_attention: bool = False, **overrides) -> SearchOptions:
        """The model's decode config as :class:`SearchOptions`, with the given overrides.

        Raises:
            ValueError: invalid options (e.g. nbest > beam size).
        """
        return SearchOptions.from_config(self.config.decode, beam_size=beam_size, nbest=nbest,
                                         length_penalty=length_penalty, return_attention=return_attention,
                                         **overrides)

    def translate(
        self, sentences: list[str], beam_size: int | None = None, nbest: int = 1,
        batch_size: int | None = None, length_penalty: float | None = None,
        return_attention: bool = False, options: SearchOptions | None = None,
        constraints: list[list[str]] | None = None, alignments: bool = False, alignment_layer: int | None = None,
        on_step: Callable[[int, list[int]], bool] | None = None, return_token_log_probs: bool = True,
        tgt_lang: str | None = None,
    ) -> list[Translation]:
        """Translate raw sentences.

        Args:
            sentences: raw text, one sentence each; empty strings translate to ``nbest`` empty
                hypotheses (score 0).
            beam_size: K (1 = greedy search); default from the model's decode config.
            nbest: hypotheses per sentence (<= beam_size).
            batch_size: sentences per search batch (sorted by length); default from config.
            length_penalty: alpha; default from config (unused by ``length_penalty_type: average``,
                whose score is always the mean log-probability per token, EOS included).
            return_attention: also compute each best hypothesis' source attention.
            options: all search options at once (then beam_size, nbest, length_penalty,
                return_attention and return_token_log_probs are ignored).
            constraints: one list per sentence of phrases (raw text, tokenised by the target
                tokenizer) its translation must contain (``attnmt.search.constraints``); a
                sentence whose phrases cannot fit its output length limit is translated without
                them, with a warning logged and kept in ``Translation.warnings``; a phrase the
                target vocabulary cannot spell is refused (:meth:`check_constraints`).
            alignments: add each hypothesis' word alignment (``ScoredHypothesis.alignment``)
                from the source attention of decoder layer ``alignment_layer`` (1-based; default
                ``attnmt.config.DEFAULT_ALIGNMENT_LAYER``, at most the last layer).
            on_step: streaming: called after each search step with a sentence's input index and
                its settled tokens (``SearchOptions.on_step``); True stops that sentence.
            return_token_log_probs: False lets an engine leave ``token_log_probs`` empty where
                they would cost it a forced-decoding pass (CTranslate2's early-stopping search);
                ``log_prob`` and ``score`` are always filled.
            tgt_lang: the language to translate into: required by a multilingual model (one
                of ``config.tokenizer.target_languages``); a bilingual model takes None or its
                own target language.
        Returns:
            One :class:`Translation` per input sentence, in input order, each with ``nbest``
            hypotheses (with a model whose scores are not finite, empty ones with score -inf).
        Raises:
            ValueError: invalid options, a constraint list per sentence that does not match
                ``sentences``, or an alignment layer the model lacks.
            LanguageError: ``tgt_lang`` missing for a multilingual model, or unknown (before any work).
            ConstraintError: a phrase with no target token or an unknown one (before any work).
            UnsupportedOption: one the engine lacks (before any work), e.g. constraints, or
                alignments (attention) with ONNX Runtime, or of n-best lists with CTranslate2.
        """
        if options is None:
            options = self.options(beam_size, nbest, length_penalty, return_attention,
                                   return_token_log_probs=return_token_log_probs)
        todo = [i for i, s in enumerate(sentences) if s.strip()]
        src_ids = self.encode_sources([sentences[i] for i in todo], tgt_lang)
        tagged = len(languages.source_prefix(self.config, self.src_tokenizer, tgt_lang))
        warnings: dict[int, list[str]] = {}
        if constraints is not None:
            if len(constraints) != len(sentences):
                raise ValueError(f"{len(constraints)} constraint lists for {len(sentences)} sentences")
            self.check_constraints(constraints)
            ids, warnings = self.encode_constraints([constraints[i] for i in todo], src_ids, options,
                                                    [i + 1 for i in todo])
            options = replace(options, constraints=ids)
        if on_step is not None:
            options = replace(options, on_step=lambda k, tokens: on_step(todo[k], tokens))
        if alignments:
            options = replace(options, return_attention=True)
            if options.nbest > 1:  # the other hypotheses' attention comes from forced decoding
                require(self.engine, "attention", "alignments of n-best lists")
        check_supported(self.engine, options)  # once for the whole request, before any work
        layer = self._alignment_layer(alignment_layer) if alignments else 0
        done = self._search(src_ids, options, batch_size)
        results = [self.empty(options.nbest)] * len(sentences)
        for k, (i, translation) in enumerate(zip(todo, done)):
            translation.warnings = warnings.get(k, [])
            if alignments:
                self.align(src_ids[k], translation, layer, tagged)
            results[i] = translation
        if alignments:  # empty lines: empty alignments
            results = [r if i in set(todo) else Translation([replace(h, alignment=[]) for h in r.hypotheses])
                       for i, r in enumerate(results)]
        return results

    def sentence_starts(self) -> Callable[[list[str]], list[list[int]]] | None:
        """The sentence splitter learned with the model, loaded once (``attnmt.data.sentence_model
        .starts_of``: texts -> per text, its sentence starts); None where the directory it was
        loaded from has none, or it was built from objects."""
        from attnmt.data import sentence_model

        return sentence_model.starts_of(self.directory) if self.directory else None

    def translate_document(self, document: str | bytes, input_format: str = "text", split_sentences: bool = True,
                           src_lang: str | None = None, tgt_lang: str | None = None, beam_size: int | None = None,
                           batch_size: int | None = None, length_penalty: float | None = None,
                           options: SearchOptions | None = None) -> str | bytes:
        """Translate a document, its markup and whitespace kept (``attnmt.documents``; docs/documents.md).

        Args:
            document: text, or bytes for ``docx`` (whose translation is bytes too).
            input_format: one of ``attnmt.documents.INPUT_FORMATS`` ('lines', 'html', ...), any case.
            split_sentences: for 'lines': split each line into sentences (the others always split).
            src_lang: the source language for the sentence splitter (default the model's).
            tgt_lang, beam_size, batch_size, length_penalty, options: as :meth:`translate`.
        Raises:
            DocumentError: a document that is not of its format (the message names the place).
            OptionError, LanguageError, UnsupportedOption: an unknown format; as :meth:`translate`.
        """
        from attnmt.decode.documents import backend, source_language
        from attnmt.documents import translate_document

        options = options or self.options(beam_size, 1, length_penalty, return_token_log_probs=False)
        return translate_document(document, input_format, backend(self, options, batch_size, tgt_lang),
                                  source_language(self, src_lang), split_sentences)

    @staticmethod
    def empty(nbest: int = 1) -> Translation:
        """The translation of an empty line: ``nbest`` empty hypotheses with score 0."""
        return empty_translation(nbest)

    def translate_ids(self, src_ids: list[list[int]], options: SearchOptions, batch_size: int | None = None
                      ) -> list[Translation]:
        """Translate already tokenised sources (:meth:`encode_sources`, each ending with EOS)
        in length-sorted batches of ``batch_size`` (default from the config).

        Raises:
            UnsupportedOption: an option the engine lacks (before any work).
            PositionError: a source longer than the model's max_positions (before any work).
        """
        check_supported(self.engine, options)
        check_positions(src_ids, self.config.model.max_positions, "source")
        return self._search(src_ids, options, batch_size)

    def _search(self, src_ids: list[list[int]], options: SearchOptions, batch_size: int | None = None
                ) -> list[Translation]:
        """:meth:`translate_ids` once the options are checked."""
        batch_size = batch_size or self.config.decode.batch_size
        hyps = search_in_batches(src_ids, options, batch_size, self.engine.translate, self.inter_threads)
        return [Translation([self._hypothesis(h) for h in hs], self.src_tokenizer.pieces(ids[:-1]) + ["</s>"],
                            hs[0].attention if options.return_attention else None)
                for ids, hs in zip(src_ids, hyps)]

    def attention(self, src_ids: list[int], out_ids: list[int]) -> dict[str, torch.Tensor]:
        """``NativeEngine.attention``: all attention weights of a forced output, float32, one
        tensor per kind: 'source' (L, H, T, S), 'encoder' (L, H, S, S), 'decoder' (L, H, T, T).

        Raises:
            UnsupportedOption: another engine.
        """
        return self._engine("attention", "attention weights").attention(src_ids, out_ids)

    def source_attention(self, src_ids: list[int], out_ids: list[int]) -> torch.Tensor:
        """Encoder-decoder attention of a forced output: float32 (L, H, T, S) (see :meth:`attention`)."""
        return self.attention(src_ids, out_ids)["source"]

    def score(self, sources: list[str], targets: list[str], batch_size: int | None = None,
              tgt_lang: str | None = None) -> list[ScoredHypothesis]:
        """Forced decoding: the log-probability of given translations under the model
        (``attnmt.decode.scoring``).

        Args:
            sources, targets: raw sentences, pairwise (an empty target scores only its EOS).
            batch_size: sentences per forward pass; default from the decode config.
            tgt_lang: the targets' language (a multilingual model's tag; see :meth:`translate`).
        Returns:
            One :class:`ScoredHypothesis` per pair: ``token_ids`` are the target ids + EOS,
            ``token_log_probs`` their natural-log probabilities, ``log_prob`` = ``score`` = their sum.
        Raises:
            ValueError: different numbers of sources and targets.
            UnsupportedOption: an engine without the 'score' capability (ONNX Runtime).
            LanguageError: see :meth:`translate`.
            PositionError: a target longer than the model's max_positions - 1 subwords, for
                every engine alike and before any engine runs (sources are cut to fit, with a
                warning, as in :meth:`translate`).
        """
        from attnmt.decode.scoring import score_pairs

        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        return score_pairs(self, sources, targets, batch_size, tgt_lang)
