"""The sentence splitter learned in preparation (attnmt.data.sentence_model) and how documents use it."""

import gzip
import logging
import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from .conftest import copy_task_config, multi30k_data

from attnmt.data import sentence_model
from attnmt.documents import Backend, translate_document
from attnmt.documents.sentences import split

HARD = [("de", "Wir brauchen z. B. Äpfel. Dr. Müller kommt am 3. Mai um ca. 8 Uhr.", 2),
        ("de", "Das kostet ca. 5 Euro. Wir wohnen in der Hauptstr. 5 in Berlin.", 2),
        ("de", "Am 3. Mai kam sie. Am 4. Juni ging er.", 2),
        ("de", "Er kam u. a. mit Anna. Sie blieb zu Hause...", 2)]


def _lines(data, name, lang):
    with gzip.open(data / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _exact(paragraphs, splitter) -> int:
    """How many paragraphs the splitter cuts exactly into the sentences they were joined from."""
    return sum([p[a:b] for a, b in splitter(p)] == sentences for p, sentences in paragraphs)


@pytest.fixture(scope="module")
def learned_de(tmp_path_factory):
    """The German splitter learned from the first 5,000 Multi30k training lines."""
    multi30k_dir = multi30k_data()
    if multi30k_dir is None:
        pytest.skip("Multi30k not found: set ATTNMT_DATA to the directory holding multi30k/")
    multi30k_dir = multi30k_dir / "multi30k"
    directory = tmp_path_factory.mktemp("sentences_de")
    sentence_model.save(sentence_model.train(_lines(multi30k_dir, "train", "de")[:5000], "de", 1), directory)
    return sentence_model.starts_of(directory)


def test_learned_starts_end_captions_without_a_full_stop(learned_de, multi30k_dir):
    val = _lines(multi30k_dir / "multi30k", "val", "de")[:400]
    paragraphs = [(" ".join(val[i:i + 4]), val[i:i + 4]) for i in range(0, len(val), 4)]
    rules = _exact(paragraphs, lambda p: split(p, "de"))
    both = _exact(paragraphs, lambda p: split(p, "de", learned_de([p])[0]))
    assert rules <= 90 and both >= 96, (rules, both)  # of 100 paragraphs
    text = "Zwei Männer in Schwarz stehen in einer Stadt Ein Hund rennt über die Wiese."
    assert [text[a:b] for a, b in split(text, "de", learned_de([text])[0])] == [
        "Zwei Männer in Schwarz stehen in einer Stadt", "Ein Hund rennt über die Wiese."]


@pytest.mark.parametrize("lang, text, n", HARD)
def test_the_rules_still_decide_at_punctuation(learned_de, lang, text, n):
    both = split(text, lang, learned_de([text])[0])
    assert both == split(text, lang) and len(both) == n


def test_a_learned_start_is_taken_only_after_whitespace_that_follows_a_letter_or_digit():
    text = "Ein Mann, Der Hund  Zwei Katzen Drei5Vögel."
    every_word = [i for i in range(1, len(text)) if not text[i].isspace()]  # a splitter that starts everywhere
    pieces = [text[a:b] for a, b in split(text, "de", every_word)]
    assert pieces == ["Ein", "Mann, Der", "Hund", "Zwei", "Katzen", "Drei5Vögel."]
    assert split("  ", "de", [1]) == []


def test_documents_use_the_backends_splitter_and_keep_whitespace():
    calls = []

    def translate(sentences, alignments):
        calls.append(sentences)
        return [(s.upper(), None) for s in sentences]

    asked = []

    def starts(texts):
        asked.append(texts)
        return [[t.index("Der")] if "Der" in t else [] for t in texts]

    backend = Backend(translate, lambda s: len(s.split()), 50, starts)
    out = translate_document("Ein Mann in einer Stadt  Der Hund bellt.\n\nZwei.\n", "text", backend, "de")
    assert out == "EIN MANN IN EINER STADT  DER HUND BELLT.\n\nZWEI.\n"
    assert calls == [["Ein Mann in einer Stadt", "Der Hund bellt.", "Zwei."]]
    assert asked == [["Ein Mann in einer Stadt  Der Hund bellt.", "Zwei."]]  # every segment in one call
    calls.clear()
    translate_document("Ein Mann in einer Stadt  Der Hund bellt.", "text", replace(backend, sentence_starts=None), "de")
    assert calls == [["Ein Mann in einer Stadt  Der Hund bellt."]]


def test_training_is_seeded_and_leaves_the_global_random_states_alone_pytorchs_included(tmp_path):
    lines = [f"Ein Mann {w} in der Stadt" for w in ("läuft", "steht", "sitzt", "liest", "isst")] * 40
    import torch

    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    expected = random.random(), np.random.random(), torch.rand(1).item()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    a = sentence_model.train(lines, "de", 1)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected
    b = sentence_model.train(lines, "de", 1)
    assert a.get_pipe("senter").model.to_bytes() == b.get_pipe("senter").model.to_bytes()


def test_training_writes_it_into_the_run_and_exports_and_rules_writes_none(tmp_path):
    from attnmt.config import config_from_dict
    from attnmt.decode.documents import backend
    from attnmt.decode.translator import Translator
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.train.loop import train

    raw = copy_task_config(tmp_path, max_steps=2)
    train(config_from_dict(raw), tmp_path / "run", progress=False)
    assert (tmp_path / "run" / sentence_model.FOLDER / "meta.json").is_file()
    assert (tmp_path / "run" / "data" / sentence_model.FOLDER / "meta.json").is_file()
    tr = Translator.from_dir(tmp_path / "run")
    assert backend(tr, tr.options(), None, None).sentence_starts is sentence_model.starts_of(tmp_path / "run")
    assert tr.sentence_starts() is sentence_model.starts_of(tmp_path / "run")
    assert sentence_model.starts_of(tmp_path / "run") is not None
    export = export_ctranslate2(tmp_path / "run", tmp_path / "ct2")
    assert (export / sentence_model.FOLDER / "meta.json").is_file()
    code = ("import sys; from attnmt.data import sentence_model; "
            f"starts = sentence_model.starts_of({str(export)!r}); print(starts is not None, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stderr  # CTranslate2's engine runs without PyTorch
    (export / sentence_model.FOLDER / "config.cfg").write_text("[nlp]\nlang = @misc(\"never read\")\n")
    assert len(sentence_model.starts_of(export)(["Ein Mann. Ein Hund.", "Zwei"])) == 2  # its config is never read

    raw["tokenizer"]["sentence_splitter"] = "rules"
    (tmp_path / "b").mkdir()
    train(config_from_dict(raw), tmp_path / "b" / "run", progress=False)
    assert not (tmp_path / "b" / "run" / sentence_model.FOLDER).exists()
    tr = Translator.from_dir(tmp_path / "b" / "run")
    assert backend(tr, tr.options(), None, None).sentence_starts is None


def test_a_damaged_folder_is_said_once_and_the_rules_split_alone(tmp_path, caplog):
    folder = tmp_path / sentence_model.FOLDER
    folder.mkdir()
    (folder / "meta.json").write_text('{"lang": "de"}', encoding="utf-8")
    (folder / "senter").mkdir()
    (folder / "senter" / "model").write_bytes(b"\x00not msgpack")
    with caplog.at_level(logging.WARNING):
        assert sentence_model.starts_of(tmp_path) is None
    assert "does not load" in caplog.text and "rules alone" in caplog.text
    assert sentence_model.starts_of(tmp_path / "nothing") is None
