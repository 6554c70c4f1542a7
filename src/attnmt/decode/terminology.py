"""Terminology constraints, from raw text to target ids: the phrases a sentence's translation
must contain.

A phrase the target vocabulary cannot spell is refused (:func:`check_constraints`); a
sentence's phrases that cannot fit its output length limit are left out, with a warning
(:func:`encode_constraints`). The constrained search itself is ``attnmt.search.constraints``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnmt.data.tokenizers import UNK_ID, Tokenizer
from attnmt.errors import OptionError
from attnmt.search.constraints import constraints_fit
from attnmt.search.hypothesis import output_length_limits

if TYPE_CHECKING:
    from attnmt.data.tokenizers import WordTokenizer
    from attnmt.decode.engine import SearchOptions


class ConstraintError(OptionError):
    """A constraint phrase the target vocabulary cannot spell: it encodes to no token (only
    characters the tokenizer drops), or to the unknown token, which the output would then show.

    Attributes:
        line: the 1-based number of the sentence the phrase belongs to.
        phrase: the phrase as given.
        reason: what is wrong with it (without the sentence).
    """

    def __init__(self, line: int, phrase: str, reason: str):
        super().__init__(f"sentence {line}: constraint {phrase!r} {reason}")
        self.line = line
        self.phrase = phrase
        self.reason = reason


def check_constraints(tgt_tokenizer: Tokenizer | WordTokenizer, constraints: list[list[str]],
                      lines: list[int] | None = None) -> None:
    """Refuse a phrase the target tokenizer cannot spell: one that encodes to no token (e.g.
    a zero-width space), or to the unknown token (characters or words outside the target
    vocabulary), which constrained search would force into the output as '<unk>'. Blank
    phrases mean none and pass.

    Args:
        tgt_tokenizer: the model's target tokenizer.
        constraints: per sentence, its phrases (raw text).
        lines: each sentence's 1-based number (default 1, 2, ...).
    Raises:
        ConstraintError: the first such phrase, with its sentence.
    """
    for phrases, line in zip(constraints, lines or range(1, len(constraints) + 1)):
        for phrase in phrases:
            if not phrase.strip():
                continue
            ids = tgt_tokenizer.encode(phrase.strip())
            if not ids:
                raise ConstraintError(line, phrase, "has no target token (the tokenizer drops every character "
                                      "of it)")
            if UNK_ID in ids:
                unknown = []
                if isinstance(tgt_tokenizer, Tokenizer):  # subwords: name the characters
                    unknown = [c for c in dict.fromkeys(phrase.strip()) if not c.isspace()
                               and UNK_ID in tgt_tokenizer.encode(c)]
                what = f"characters {''.join(unknown)!r}" if unknown else "words"
                raise ConstraintError(line, phrase, f"has {what} outside the target vocabulary (the output would "
                                      "show <unk>)")


def encode_constraints(tgt_tokenizer: Tokenizer | WordTokenizer, max_positions: int, constraints: list[list[str]],
                       src_ids: list[list[int]], options: SearchOptions, lines: list[int]
                       ) -> tuple[list[list[list[int]]], dict[int, list[str]]]:
    """Phrases as target token ids, each sentence's left out where they cannot fit its output
    length limit (``attnmt.search.constraints.constraints_fit``).

    Args:
        tgt_tokenizer: the model's target tokenizer.
        max_positions: the model's ``max_positions`` (the output limit is at most one less).
        constraints: per sentence, its phrases (raw text; blank ones are ignored).
        src_ids: the sentences' source ids (their lengths set the limits).
        options: the search options (``max_len_a``, ``max_len_b``).
        lines: each sentence's 1-based number, for the warnings.
    Returns:
        The token-id phrases per sentence, and the warnings by sentence position (the caller
        logs them).
    """
    limit = max_positions - 1
    out: list[list[list[int]]] = []
    warnings: dict[int, list[str]] = {}
    for k, (phrases, src, line) in enumerate(zip(constraints, src_ids, lines)):
        ids = [tgt_tokenizer.encode(p.strip()) for p in phrases if p.strip()]
        ids = [p for p in ids if p]
        cap = output_length_limits([len(src)], options.max_len_a, options.max_len_b, limit)[0]
        if ids and not constraints_fit(ids, cap):
            warnings[k] = [f"sentence {line}: its constraints need {sum(map(len, ids))} tokens + EOS but its output "
                           f"limit is {cap} tokens; translated without them"]
            ids = []
        out.append(ids)
    return out, warnings
