"""The rules between keys of the configuration, checked once a section (or the whole
configuration) is read: pydantic's after-validators of :class:`attnmt.config.corpus.DataConfig`,
:class:`attnmt.config.schema.ModelConfig` and :class:`attnmt.config.schema.Config`, each
``self`` being the section validated, and :data:`APPLIES_ONLY_TO`, the keys that matter only to
some values of another key. A broken rule raises :class:`KeyRuleError` naming its key, or a
``ValueError`` where the rule is about the section as a whole.

Library: pydantic (the validators' ``ValidationInfo``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import ValidationInfo

from attnmt.config.language_codes import LANGUAGE, canonical_language, canonical_pair, known_as

if TYPE_CHECKING:
    from attnmt.config.corpus import DataConfig
    from attnmt.config.schema import Config, ModelConfig


class KeyRuleError(ValueError):
    """A cross-field rule broken by the configuration key ``key`` ('section.name'): the error
    message names the key (and the line that sets it, where a file does)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def data_section_rules(self: DataConfig) -> DataConfig:
    """The rules of ``data``: one source of text, a pair's two codes, its corpora and
    validation sets given once each.

    Raises:
        ValueError, KeyRuleError: naming the first key that breaks a rule.
    """
    text = [self.dataset is not None, self.train_src is not None or self.train_tgt is not None,
            self.train is not None]  # beside data.prepared: the text it was prepared from (checked then)
    if sum(text) > 1 or sum(text) + (self.prepared is not None) == 0 or (
            text[1] and (self.train_src is None or self.train_tgt is None)):
        raise ValueError("give one of data.dataset (with data.pair), data.train_src and data.train_tgt, "
                         "data.train (a list of {src, tgt, weight}) or data.prepared")
    if self.train is not None and not self.train:
        raise ValueError("data.train lists no corpus")
    if self.train is not None and self.pair is None and any(e.src_lang or e.tgt_lang for e in self.train):
        for i, entry in enumerate(self.train):  # languages given per entry: every entry gives both
            for side in ("src_lang", "tgt_lang"):
                if getattr(entry, side) is None:
                    raise KeyRuleError("data.train", f"data.train[{i}].{side} is missing: where data.train "
                                       f"entries name their languages, each needs src_lang and tgt_lang "
                                       f"(or give data.pair for the default)")
    if self.dataset is not None and (self.pair is None) == (self.pairs is None):
        raise ValueError("data.dataset needs data.pair, e.g. 'de-en', or data.pairs (a list), not both")
    if self.pairs is not None and self.dataset is None:
        raise ValueError("data.pairs names pairs of a data.dataset; give data.dataset too")
    for pair in [self.pair] * (self.pair is not None) + list(self.pairs or []):
        langs = pair.split("-")
        if len(langs) != 2 or not all(re.fullmatch(LANGUAGE, lang) for lang in langs) \
                or canonical_language(langs[0]) == canonical_language(langs[1]):
            raise ValueError(f"data.pair {pair!r}: expected two different language codes, e.g. 'de-en'")
    if self.pairs is not None and len(set(self.pairs)) != len(self.pairs):
        raise ValueError("data.pairs names a pair twice")
    if self.max_pairs is not None:
        directions = self.pairs or [self.pair] * (self.pair is not None)
        for pair in self.max_pairs:
            if known_as(pair, directions, canonical_pair) is None:
                raise KeyRuleError("data.max_pairs", f"data.max_pairs names {pair!r}, not a pair of data.pair "
                                   f"or data.pairs ({', '.join(directions) or 'none: give data.dataset'})")
    if (self.valid_src is None) != (self.valid_tgt is None):
        raise ValueError("give both data.valid_src and data.valid_tgt, or neither")
    if self.valid is not None and self.valid_src is not None:
        raise ValueError("give data.valid (a list) or data.valid_src and data.valid_tgt, not both")
    if self.valid is not None and not self.valid:
        raise ValueError("data.valid lists no validation set")
    return self


def model_section_rules(self: ModelConfig) -> ModelConfig:
    """The rules of ``model``: heads divide the width, the norm placements and frozen embeddings.

    Raises:
        KeyRuleError: naming the first key that breaks a rule.
    """
    if self.head_dim is None and self.d_model % self.num_heads:
        raise KeyRuleError("model.num_heads", f"model.d_model ({self.d_model}) must be divisible by "
                           f"model.num_heads ({self.num_heads})")
    if self.pre_post_norm and self.norm_first:
        raise KeyRuleError("model.pre_post_norm", "model.pre_post_norm and model.norm_first exclude each other")
    if self.freeze_embeddings and self.tie_output:
        raise KeyRuleError("model.freeze_embeddings", "model.freeze_embeddings would freeze the tied output "
                           "layer too; set model.tie_output false")
    return self


# Keys that matter only to some values of another key: (section, key) -> (section, option, the
# option's values where the key applies). A key set explicitly (pydantic's ``model_fields_set``:
# written in the file or given with --set) to a value other than its default while its option has
# another value is refused, naming the option, so a knob never silently does nothing.
APPLIES_ONLY_TO: dict[tuple[str, str], tuple[str, str, tuple[str | bool, ...]]] = {
    **{("train", k): ("train", "schedule", ("cosine_restarts",))
       for k in ("first_decay_steps", "t_mul", "m_mul", "alpha")},
    **{("train", k): ("train", "schedule", ("time_budget",)) for k in ("warmup_fraction", "budget_decay")},
    ("train", "lr_factor"): ("train", "schedule", ("noam",)),
    ("train", "lr"): ("train", "schedule", ("constant", "inverse_sqrt", "cosine_restarts", "time_budget")),
    ("train", "warmup_steps"): ("train", "schedule", ("noam", "constant", "inverse_sqrt")),
    **{("train", k): ("train", "optimizer", ("sgd",)) for k in ("momentum", "nesterov")},
    **{("train", k): ("train", "optimizer", ("adam",)) for k in ("adam_betas", "adam_eps")},
    **{("tokenizer", k): ("tokenizer", "kind", ("sentencepiece",))
       for k in ("model_type", "vocab_size", "character_coverage", "max_sentences")},
    **{("tokenizer", k): ("tokenizer", "kind", ("word",))
       for k in ("lowercase", "min_freq", "max_vocab", "token_filter", "require_vectors", "src_lang", "tgt_lang")},
    **{("model", k): ("tokenizer", "kind", ("word",)) for k in ("src_vectors", "tgt_vectors")},
    ("model", "positional_layout"): ("model", "positional", ("sinusoidal",)),
    **{("decode", k): ("decode", "length_penalty_type", ("gnmt",)) for k in ("length_penalty", "length_penalty_k")},
    ("decode", "patience"): ("decode", "early_stopping", (True,)),
    ("train", "compile"): ("train", "loss_normalization", ("tokens",)),
    ("train", "dropout_curriculum"): ("train", "compile", (False,)),  # a new rate would recompile the graph
}


def _unused_keys(config: "Config") -> None:
    """Refuse a key of :data:`APPLIES_ONLY_TO` set to a non-default value for an option not in use.

    Raises:
        KeyRuleError: naming the first such key and the option it belongs to.
    """
    for (section, key), (opt_section, option, values) in APPLIES_ONLY_TO.items():
        sec = getattr(config, section)
        if key not in sec.model_fields_set or getattr(sec, key) == type(sec).model_fields[key].get_default(
                call_default_factory=True):
            continue
        value = getattr(getattr(config, opt_section), option)
        if value not in values:
            wanted = " or ".join(str(v).lower() if isinstance(v, bool) else v for v in values)
            raise KeyRuleError(f"{section}.{key}", f"{section}.{key} applies only to {opt_section}.{option} {wanted}, "
                               f"and {opt_section}.{option} is {value}: remove {section}.{key} or set "
                               f"{opt_section}.{option}")


def language_rules(config: "Config") -> None:
    """The rules of a multilingual model (``tokenizer.target_languages`` set, in the file or filled
    in from the training data by ``attnmt.languages.resolve``, which checks them again then): one
    joint SentencePiece vocabulary for every language, and no subword sampling (the tags lead
    the sources, and a sampled segmentation would split them).

    Raises:
        KeyRuleError: naming the key to change.
    """
    targets = config.tokenizer.target_languages
    if not targets:
        return
    if config.tokenizer.kind == "word" or not config.tokenizer.joint:
        raise KeyRuleError("tokenizer.target_languages", "a multilingual model (tokenizer.target_languages) needs "
                           "one SentencePiece vocabulary for all its languages: set tokenizer.kind sentencepiece and "
                           "tokenizer.joint true")
    if config.train.subword_alpha is not None:
        raise KeyRuleError("train.subword_alpha", "train.subword_alpha is for a model without language tags; this "
                           f"one translates into {', '.join(targets)}")


def cross_section_rules(self: Config, info: ValidationInfo) -> Config:
    """:data:`APPLIES_ONLY_TO` (skipped for the saved configuration of a model directory:
    ``context={"saved": True}``), then the rules between keys of different sections."""
    if not (info.context or {}).get("saved"):
        _unused_keys(self)
    if self.data is not None and self.data.max_len + 1 > self.model.max_positions:
        raise KeyRuleError("data.max_len", f"data.max_len ({self.data.max_len}) + 1 (EOS) must not exceed "
                           f"model.max_positions ({self.model.max_positions})")
    if self.train.schedule == "time_budget" and self.train.max_minutes is None:
        raise KeyRuleError("train.schedule", "train.schedule time_budget needs train.max_minutes (the budget "
                           "its warmup and decay are fitted to)")
    if self.tokenizer.require_vectors and (self.model.src_vectors is None or self.model.tgt_vectors is None):
        raise KeyRuleError("tokenizer.require_vectors", "tokenizer.require_vectors needs model.src_vectors and "
                           "model.tgt_vectors")
    no_pair = self.data is None or self.data.pair is None
    if self.tokenizer.kind == "word" and no_pair and None in (self.tokenizer.src_lang, self.tokenizer.tgt_lang):
        raise KeyRuleError("tokenizer.kind", "tokenizer.kind word needs data.pair or tokenizer.src_lang and "
                           "tokenizer.tgt_lang")
    if self.train.subword_alpha is not None and self.tokenizer.kind == "word":
        raise KeyRuleError("train.subword_alpha", "train.subword_alpha samples SentencePiece segmentations: it "
                           "needs tokenizer.kind sentencepiece")
    if "subword_nbest" in self.train.model_fields_set and self.train.subword_nbest != -1 and (
            self.train.subword_alpha is None or self.train.subword_nbest in (0, 1)):
        raise KeyRuleError("train.subword_nbest", "train.subword_nbest applies with train.subword_alpha and is -1 "
                           f"or at least 2 (0 and 1 sample nothing), not {self.train.subword_nbest}")
    if self.tokenizer.kind == "word" and self.tokenizer.joint:
        raise KeyRuleError("tokenizer.kind", "tokenizer.kind word builds one vocabulary per side: set "
                           "tokenizer.joint false")
    language_rules(self)
    return self
