"""Control over the output with a model trained in the test session: terminology constraints,
word alignments and confidence, through the Python API and the command line."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest

from attnmt import cli
from attnmt.decode.engine import UnsupportedOption
from attnmt.decode.translator import Translator
from attnmt.search.options import CORE_OPTIONS

SENTENCES = ["ein mann sieht hund", "frau fährt auto", "kind spielt ball und katze sieht haus", "katze"]
# One term each that the plain translation lacks (the toy task's words), and one sentence without.
CONSTRAINTS = [["cat"], ["red car"], [], ["big", "house"]]


@pytest.fixture(scope="module")
def translator(dictionary_model_dir):
    return Translator.from_dir(dictionary_model_dir)


def _words(text: str) -> list[str]:
    return text.split()


@pytest.mark.parametrize("beam_size", [1, 4])
def test_constraints_always_appear_and_leave_other_sentences_alone(translator, beam_size):
    plain = translator.translate(SENTENCES, beam_size=beam_size)
    for p, phrases in zip(plain, CONSTRAINTS):
        assert not any(phrase in p.text for phrase in phrases)  # each constraint changes the output
    out = translator.translate(SENTENCES, beam_size=beam_size, constraints=CONSTRAINTS)
    for t, phrases in zip(out, CONSTRAINTS):
        for phrase in phrases:
            assert phrase in t.text, (phrase, t.text)
    assert out[2].hypotheses[0].token_ids == plain[2].hypotheses[0].token_ids
    if beam_size > 1:  # the unconstrained sentence of the batch: exactly plain beam search
        assert out[2].hypotheses[0].score == plain[2].hypotheses[0].score
    else:  # constrained greedy is one-beam beam search: the same tokens, scores summed in float32
        assert out[2].hypotheses[0].score == pytest.approx(plain[2].hypotheses[0].score, abs=1e-5)
    # No constraints at all (None, or all empty): exactly the plain search.
    same = translator.translate(SENTENCES, beam_size=beam_size, constraints=[[]] * len(SENTENCES))
    assert [(t.hypotheses[0].token_ids, t.hypotheses[0].score) for t in same] == \
        [(t.hypotheses[0].token_ids, t.hypotheses[0].score) for t in plain]


def test_an_over_long_constraint_is_reported_and_dropped(translator, caplog):
    long_phrase = " ".join(["dog cat house"] * 12)  # more tokens than the output limit of a 1-word source
    with caplog.at_level(logging.WARNING):
        out = translator.translate(["katze", "hund"], beam_size=3, constraints=[[long_phrase], ["cat"]])
    assert "sentence 1" in caplog.text and "output limit" in caplog.text and "sentence 2" not in caplog.text
    assert out[0].warnings and "output limit" in out[0].warnings[0]
    assert out[0].text == translator.translate(["katze"], beam_size=3)[0].text
    assert "cat" in out[1].text and not out[1].warnings


def test_an_engine_without_constraints_refuses_in_one_line(translator):
    class NoConstraints:
        name, supports = "toy", CORE_OPTIONS | {"exact_stopping"}
        device, precision = "cpu", "fp32"

        def translate(self, sources, options):
            raise AssertionError("must be refused before any work")

    other = Translator(NoConstraints(), translator.src_tokenizer, translator.tgt_tokenizer, translator.config)
    with pytest.raises(UnsupportedOption, match="^the toy engine does not support constraints$"):
        other.translate(["hund"], beam_size=2, constraints=[["cat"]])


def test_alignments_are_in_range_and_follow_the_word_for_word_task(translator):
    out = translator.translate(SENTENCES, beam_size=4, alignments=True)
    diagonal = total = 0
    for sentence, t in zip(SENTENCES, out):
        n_src, n_tgt = len(_words(sentence)), len(_words(t.text))
        assert [j for _, j in t.alignment] == list(range(n_tgt))  # each target word once, in order
        for i, j in t.alignment:
            assert 0 <= i < n_src and 0 <= j < n_tgt
            diagonal += i == j
            total += 1
    assert diagonal / total >= 0.5  # the toy task translates word for word, in order


def test_word_probabilities_agree_with_forced_decoding(translator):
    out = translator.translate(SENTENCES, beam_size=4)
    scored = translator.score(SENTENCES, [t.text for t in out])
    for t, s in zip(out, scored):
        h = t.hypotheses[0]
        words, probs = translator.confidence(h)
        s_words, s_probs = translator.confidence(s)
        assert words == s_words == _words(t.text)
        assert probs == pytest.approx(s_probs, rel=1e-3)
        assert h.mean_log_prob == pytest.approx(h.log_prob / len(h.token_ids))
        assert sum(map(math.log, probs)) + h.token_log_probs[-1] == pytest.approx(h.log_prob, abs=1e-4)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_cli_constraints_alignments_and_confidence(dictionary_model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.de", SENTENCES)
    terms = _write(tmp_path / "terms.tsv", ["\t".join(c) for c in CONSTRAINTS])
    base = ["translate", "--model", str(dictionary_model_dir), "--input", src, "--beam-size", "4"]
    assert cli.main(base + ["--constraints", terms, "--alignments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SENTENCES)
    for line, phrases, sentence in zip(lines, CONSTRAINTS, SENTENCES):
        text, alignment = line.split(" ||| ")
        assert all(p in text for p in phrases)
        pairs = [tuple(map(int, a.split("-"))) for a in alignment.split()]
        assert all(0 <= i < len(sentence.split()) and 0 <= j < len(text.split()) for i, j in pairs)
    assert cli.main(base + ["--constraints", terms, "--alignments", "--format", "jsonl"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for r, line in zip(records, lines):
        best = r["hypotheses"][0]
        assert f"{best['text']} ||| {r['alignment']}" == line
        assert len(best["word_probs"]) == len(best["words"]) == len(best["text"].split())
        assert best["mean_log_prob"] == pytest.approx(best["log_prob"] / len(best["tokens"]))
    # `attnmt score` on the same pairs gives the same word probabilities.
    hyp = _write(tmp_path / "out.en", [r["hypotheses"][0]["text"] for r in records])
    assert cli.main(["score", "--model", str(dictionary_model_dir), "--src", src, "--tgt", hyp, "--format", "jsonl"]) == 0
    scored = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:-1]
    for r, s in zip(records, scored):
        assert s["word_probs"] == pytest.approx(r["hypotheses"][0]["word_probs"], rel=1e-3)


def test_cli_constraint_file_errors_are_one_line(dictionary_model_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.de", SENTENCES)
    short = _write(tmp_path / "short.tsv", ["cat"])
    base = ["translate", "--model", str(dictionary_model_dir), "--input", src]
    assert cli.main(base + ["--constraints", short]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnmt: error: ") and short in err and "4" in err
    assert cli.main(base + ["--constraints", str(tmp_path / "missing.tsv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.tsv" in err


@pytest.mark.skipif(not os.environ.get("ATTNMT_DE_EN_MODEL"), reason="set ATTNMT_DE_EN_MODEL to a Multi30k de-en model")
def test_readme_sentence_content_words_align():
    tr = Translator.from_dir(os.environ["ATTNMT_DE_EN_MODEL"])
    sentence = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
    t = tr.translate([sentence], alignments=True)[0]
    src, tgt = sentence.split(), t.text.split()
    links = {(src[i].strip(".,"), tgt[j].strip(".,").lower()) for i, j in t.alignment}
    bike = "bicycle" if "bicycle" in t.text else "bike"
    assert {("Mann", "man"), ("Fahrrad", bike), ("Straße", "street")} <= links, (t.text, links)
