"""One model, many languages: the target-language tag and temperature sampling.

A multilingual model (Johnson et al., 2017, "Google's Multilingual Neural Machine Translation
System", section 3) is an ordinary Transformer whose source starts with a token naming the
language to translate into: ``<2fr> A man rides a bike.`` asks for French. The same model
then serves every direction it was trained on, and can be asked for directions it never saw
(zero-shot, e.g. de->fr when it learned de->en and en->fr).

* The tags are reserved SentencePiece symbols (``user_defined_symbols``): one piece each, put
  in front of the source as ids, never matched in text: a user's "<2fr>" is encoded as
  ordinary characters (``attnmt.data.tokenizers``). They exist only for the model's target
  languages, ``tokenizer.target_languages``.
* A model has tags exactly when ``tokenizer.target_languages`` lists languages. A training
  configuration whose corpora reach more than one target language gets that list filled in
  (:func:`resolve`); a bilingual model has none, so its tokenizer, data and translations are
  those of a model trained before tags existed.
* The tag goes in front of the source ids, before the source's EOS: in training (``attnmt.data.prepare``),
  and for every engine at translation time (:func:`source_prefix`, used by ``Translator``).
* An imported OPUS-MT multilingual model has its own tags, ``>>fra<<``, in its vocabulary
  (``tokenizer.language_tag: '>>{}<<'``): the same mechanism with another spelling.

Temperature sampling (Arivazhagan et al., 2019, "Massively Multilingual Neural Machine
Translation in the Wild", section 4.2): corpus c with n_c pairs (times its ``weight``) is
sampled with probability proportional to ``(n_c / N) ** (1 / T)``; T = 1 keeps the corpus
sizes' proportions, larger T flattens them towards uniform (they used T = 5).
:func:`temperature_weights` turns this into per-corpus weights for the epoch sampler
(``attnmt.data.plan.weighted_sample``), keeping the epoch's size.

Language codes are compared ignoring case wherever they are read (a configuration's entries
and pairs, ``--tgt-lang``, a server's ``tgt_lang``, LibreTranslate's ``source`` and ``target``,
the web page): ``EN`` and ``en`` are one language and one tag. A configuration writes them in
one spelling (``attnmt.config.canonical_language``: ``en``, ``pt_BR``); a model's recorded codes
keep the model's own spelling (an imported OPUS-MT model's ``pt_br``, whose tag is ``>>pt_br<<``),
and :func:`spelling` maps a code asked for to it.

Written here rather than taken from a library: the tag convention is a few lines of
bookkeeping over attnmt's own configuration and vocabularies.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from attnmt.config import KeyRuleError, canonical_language, language_rules
from attnmt.errors import ConfigError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from attnmt.config import Config

TAG = "<2{}>"  # attnmt's tag of a target language (Johnson et al. write <2es>)


class LanguageError(ConfigError):
    """A target language the model does not know, or none given where the model needs one;
    the message names the languages it knows."""


def spelling(code: str, known: list[str]) -> str | None:
    """The entry of ``known`` (a model's spellings) that names ``code``, compared ignoring case:
    the exact one first; among several that differ only in case (OPUS-MT's ``pt_br`` and
    ``pt_BR``), the canonical one (``attnmt.config.canonical_language``), else the first;
    None where none does."""
    if code in known:
        return code
    matches = [k for k in known if k.casefold() == code.casefold()]
    if not matches:
        return None
    canonical = canonical_language(code)
    return canonical if canonical in matches else matches[0]


def same_language(a: str | None, b: str | None) -> bool:
    """Whether two codes (None: not given) name one language, compared ignoring case."""
    if a is None or b is None:
        return a is b
    return a.casefold() == b.casefold()


def corpus_directions(config: "Config") -> list[tuple[str | None, str | None]]:
    """(source, target) language of each training corpus of a configuration, in
    ``attnmt.data.prepare.training_corpora``'s order; None where the configuration does not say."""
    d = config.data
    if d is None:
        return []
    if d.pairs is not None:
        return [tuple(p.split("-")) for p in d.pairs]
    fallback = config.languages()
    if d.train is not None:
        return [(e.src_lang or fallback[0], e.tgt_lang or fallback[1]) for e in d.train]
    return [fallback]


def resolve(config: "Config") -> "Config":
    """``config`` with ``tokenizer.target_languages`` filled in where its training data reaches
    more than one target language (sorted); unchanged otherwise.

    Raises:
        ConfigError: a validation set in another target language than a bilingual model's; a
            multilingual configuration with a corpus whose target language is not given, or
            (``target_languages`` set, e.g. inherited by fine-tuning) a corpus whose
            target language is not among them.
    """
    directions = corpus_directions(config)
    targets = {t for _, t in directions}
    known = config.tokenizer.target_languages
    if not known and len(targets - {None}) <= 1:  # bilingual (or many-to-one): no tags
        target = next(iter(targets - {None}), None)
        for i, entry in enumerate(config.data.valid or [] if config.data else []):
            if target is not None and not same_language(entry.tgt_lang, target):
                raise ConfigError(f"data.valid[{i}].tgt_lang is {entry.tgt_lang!r} but the training data translates "
                                  f"into {target} only: validate on {target} targets")
        return config
    if None in targets:
        raise ConfigError("a multilingual configuration needs the tgt_lang of every data.train entry (or "
                          "data.pair): one has none")
    if not known:
        out = config.model_copy(deep=True)
        out.tokenizer.target_languages = sorted(targets)
        try:  # the rules of a multilingual model, now that it is one
            language_rules(out)
        except KeyRuleError as e:
            raise ConfigError(f"{e} (the training data translates into {', '.join(sorted(targets))})") from None
        return out
    unknown = sorted(t for t in targets if spelling(t, known) is None)
    if unknown:
        raise ConfigError(f"target language {unknown[0]!r} of the training data is not one of the model's "
                          f"(tokenizer.target_languages: {', '.join(known)})")
    return config


def bilingual_languages(config: "Config") -> tuple[list[str], str | None]:
    """A bilingual model's source languages and its one target language, however the
    configuration gives them: ``tokenizer.src_lang``/``tgt_lang``, ``data.pair``, or the
    languages of its ``data.train`` entries (a many-to-one model reads several sources); [] and
    None where the configuration does not say."""
    src, tgt = config.languages()
    directions = corpus_directions(config)
    sources = [src] if src else sorted({s for s, _ in directions if s})
    targets = {t for _, t in directions if t}
    return sources, tgt or (targets.pop() if len(targets) == 1 else None)


def served_languages(config: "Config") -> tuple[list[str], list[str]]:
    """(source languages, target languages) a model translates between: a multilingual model
    takes any of its training corpora's sources into any of its target languages (the
    directions it never saw are zero-shot; a model whose sources are not recorded, e.g. an
    imported one, is taken to read its target languages); a bilingual model its one pair ([]
    where unknown).
    """
    if not config.tokenizer.target_languages:
        sources, tgt = bilingual_languages(config)
        return sources, [tgt] if tgt else []
    sources = {s for s, _ in corpus_directions(config) if s} | {config.languages()[0]} - {None}
    return sorted(sources or config.tokenizer.target_languages), list(config.tokenizer.target_languages)


def tags(config: "Config") -> list[str]:
    """The tag pieces of a configuration's target languages (none for a bilingual model)."""
    return [config.tokenizer.language_tag.format(lang) for lang in config.tokenizer.target_languages]


def target_language(config: "Config", tgt_lang: str | None) -> str | None:
    """The target language to ask a model for: ``tgt_lang`` checked against the model's
    languages, ignoring case, and returned in the model's spelling (:func:`spelling`); for a
    bilingual model None (no tag) when ``tgt_lang`` is None or its target.

    Raises:
        LanguageError: a multilingual model without ``tgt_lang``, or a language it does not
            know (the message lists those it knows).
    """
    known = config.tokenizer.target_languages
    if not known:
        own = bilingual_languages(config)[1]
        if tgt_lang is not None and own is not None and not same_language(tgt_lang, own):
            raise LanguageError(f"this model translates into {own} only, not {tgt_lang!r}")
        if tgt_lang is not None and own is None:
            log.warning("this model's configuration names no target language; it translates into the one it "
                        "was trained on, whatever --tgt-lang (tgt_lang) says: %r is not checked", tgt_lang)
        return None
    if tgt_lang is None:
        raise LanguageError(f"this model translates into several languages: choose one with --tgt-lang (the "
                            f"request's tgt_lang): {', '.join(known)}")
    lang = spelling(tgt_lang, known)
    if lang is None:
        raise LanguageError(f"unknown target language {tgt_lang!r}; this model knows {', '.join(known)}")
    return lang


def source_prefix(config: "Config", tokenizer, tgt_lang: str | None) -> list[int]:
    """The ids to put in front of every source sentence: ``[tag id]`` of ``tgt_lang`` for a
    multilingual model, ``[]`` for a bilingual one (:func:`target_language` checks it first).

    Raises:
        LanguageError: see :func:`target_language`; or the tag is missing from the vocabulary
            (a tokenizer that does not belong to the configuration).
    """
    lang = target_language(config, tgt_lang)
    if lang is None:
        return []
    piece = config.tokenizer.language_tag.format(lang)
    [token_id] = tokenizer.piece_ids([piece])
    if tokenizer.pieces([token_id]) != [piece]:  # an unknown piece maps to the unknown token
        raise LanguageError(f"the tag {piece} of target language {lang!r} is not in the model's vocabulary")
    return [token_id]


def temperature_weights(sizes: list[int], weights: list[float], temperature: float) -> list[float]:
    """Per-corpus weights for the epoch sampler under temperature sampling (module docstring).

    Args:
        sizes: pairs of each corpus (n_c).
        weights: each corpus' ``weight`` (its pairs count ``weight x n_c`` times).
        temperature: T > 0; 1 returns ``weights`` unchanged.
    Returns:
        w'_c such that corpus c gives ``w'_c x n_c`` pairs of an epoch of ``sum(weight x n)``
        pairs, a share proportional to ``(weight_c x n_c) ** (1 / T)``.
    """
    if temperature == 1.0:
        return list(weights)
    mass = [w * n for w, n in zip(weights, sizes)]
    total, largest = sum(mass), max(mass)
    # shares relative to the largest corpus, in logarithms: (m / largest) ** (1 / T) stays in [0, 1] with
    # the largest at 1, so a temperature near 0 gives the largest corpus the whole epoch, not 0 / 0
    shares = [math.exp(math.log(m / largest) / temperature) if m else 0.0 for m in mass]
    norm = sum(shares)
    return [total * s / norm / n if n else w for s, n, w in zip(shares, sizes, weights)]
