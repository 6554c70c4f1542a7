"""Documents through real engines: inline tags placed by each engine's word alignments (native,
CTranslate2) or by position (ONNX Runtime), every format's structure kept on native and
CTranslate2, and ``attnmt translate`` on documents: formats by extension, refusals, nothing written."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tests.test_documents import SRT, _docx, _tags, well_formed
from tests.test_hardening import assert_one_line_error, run_cli

# A tag around one content word of the toy German->English task, and that word's translation.
TAGGED = [("ein <b>hund</b> sieht ein auto", "<b>dog</b>"),
          ("<i>mann</i> und frau spielt", "<i>man</i>"),
          ('kind fährt ein <a href="#x">rot</a> auto', '<a href="#x">red</a>'),
          ("ein groß <b>haus</b> und ein ball", "<b>house</b>"),
          ("katze sieht <i>stadt</i> und haus", "<i>city</i>")]


@pytest.fixture(scope="module")
def engines(dictionary_model_dir, tmp_path_factory):
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator
    from attnmt.interop.onnx import export_onnx

    tmp = tmp_path_factory.mktemp("document_engines")
    return {"native": open_translator(dictionary_model_dir, "native", "cpu"),
            "ctranslate2": open_translator(export_ctranslate2(dictionary_model_dir, tmp / "ct2"), "ctranslate2", "cpu"),
            "onnxruntime": open_translator(export_onnx(dictionary_model_dir, tmp / "onnx"), "onnxruntime", "cpu")}


def _document(tr, document, fmt):
    return tr.translate_document(document, fmt, options=tr.options(early_stopping=True))


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
def test_a_tag_around_a_word_lands_around_its_translation(engines, engine):
    tr = engines[engine]
    html = "".join(f"<p>{source}</p>\n" for source, _ in TAGGED)
    out = _document(tr, html, "html")
    assert well_formed(out) and _tags(out) == _tags(html)
    paragraphs = re.findall(r"<p>(.*?)</p>", out)
    assert len(paragraphs) == len(TAGGED)
    landed = sum(expected in p for p, (_, expected) in zip(paragraphs, TAGGED))
    assert landed >= 4, paragraphs


def test_ctranslate2_aligns_words_as_the_native_engine(engines):
    from tests.conftest import GERMAN_ENGLISH

    words = sorted(GERMAN_ENGLISH)
    sentences = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(2 + i % 4)) for i in range(20)]
    native = engines["native"].translate(sentences, alignments=True, options=engines["native"].options(
        early_stopping=True))
    ct2 = engines["ctranslate2"].translate(sentences, alignments=True, options=engines["ctranslate2"].options(
        early_stopping=True))
    same = [n.alignment == c.alignment for n, c in zip(native, ct2) if n.text == c.text]
    assert ct2[0].alignment and len(same) >= 15 and all(same)


@pytest.mark.parametrize("engine", ["native", "ctranslate2"])
def test_formats_keep_their_structure(engines, engine):
    import docx

    tr = engines[engine]
    srt = SRT.replace("Ich gehe heute\nnach", "ein mann sieht\nein").replace("Hause. Und du?", "auto. und kind spielt") \
        .replace("Ich auch.", "hund fährt.")
    out = _document(tr, srt, "srt")
    timings = re.compile(r"^\d+\n[\d:,]+ --> [\d:,]+$", re.M)
    assert timings.findall(out) == timings.findall(srt) and out.count("\n\n") == srt.count("\n\n")
    vtt = "WEBVTT\n\nc1\n00:01.000 --> 00:02.000 align:start\nein hund.\n\n00:02.500 --> 00:03.000\nkatze spielt.\n"
    out = _document(tr, vtt, "vtt")
    assert [ln for ln in out.splitlines() if "-->" in ln or ln in ("WEBVTT", "c1")] == \
        ["WEBVTT", "c1", "00:01.000 --> 00:02.000 align:start", "00:02.500 --> 00:03.000"]
    md = "# ein *hund*\n\n- mann sieht\n- frau spielt\n\n| kind | haus |\n|---|---|\n| auto | ball |\n\n```\nein hund\n```\n"
    out = _document(tr, md, "markdown")
    assert [ln[:2] for ln in out.splitlines()] == [ln[:2] for ln in md.splitlines()] and "```\nein hund\n```" in out
    assert out.count("*") == 2 and out.count("|") == md.count("|")
    data = _docx([[("ein ", False), ("hund", True), (" sieht ein auto.", False)], [("katze spielt.", False)]])
    d = docx.Document(io.BytesIO(_document(tr, data, "docx")))
    assert [[r.bold for r in p.runs] for p in d.paragraphs] == [[False, True, False], [False]]
    assert "dog" in d.paragraphs[0].runs[1].text


def test_translate_command_reads_documents_by_extension(dictionary_model_dir, tmp_path, capsys):
    (tmp_path / "in.srt").write_text("1\n00:00:01,000 --> 00:00:02,500\nein mann\n\n"
                                     "2\n00:00:03,000 --> 00:00:04,000\nein hund\n", encoding="utf-8")
    rc, _, err = run_cli(capsys, "translate", "--model", str(dictionary_model_dir), "--input", str(tmp_path / "in.srt"),
                         "--output", str(tmp_path / "out.srt"))
    out = (tmp_path / "out.srt").read_text(encoding="utf-8")
    assert rc == 0, err
    assert out == "1\n00:00:01,000 --> 00:00:02,500\na man\n\n2\n00:00:03,000 --> 00:00:04,000\na dog\n"
    (tmp_path / "cues.txt").write_bytes((tmp_path / "in.srt").read_bytes())  # --input-format in any case
    rc, upper, err = run_cli(capsys, "translate", "--model", str(dictionary_model_dir), "--input",
                             str(tmp_path / "cues.txt"), "--input-format", "SRT")
    assert rc == 0 and upper == out, (upper, err)
    (tmp_path / "para.txt").write_text("ein hund. ein mann.\n\nkatze\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, "translate", "--model", str(dictionary_model_dir), "--input",
                           str(tmp_path / "para.txt"), "--split-sentences")
    assert rc == 0 and re.fullmatch(r"a dog[^\n]* a man[^\n]*\n\ncat\n", out), (out, err)


@pytest.mark.parametrize("name, data, args, needles", [
    ("in.docx", b"PK\x03\x04 broken", [], ["in.docx", "not a DOCX file"]),
    ("in.html", b"<p>gut</p>\n<p>\xff</p>", [], ["in.html", "line 2", "not UTF-8"]),
    ("in.srt", b"1\n00:00:01,000 -> 00:00:02,000\nein hund\n", [], ["in.srt", "line 2", "timing"]),
    # binary data split into sentences (plain lines are read as they always were, any character but a line break)
    ("in.bin", b"ein hund\n\x00\x01\x02\n", ["--split-sentences"], ["in.bin", "line 2", "binary"]),
    ("in.html", b"<p>ein hund</p>", ["--format", "jsonl"], ["--format jsonl", "html"]),
    ("in.md", b"ein hund", ["--nbest", "2"], ["--nbest", "markdown"]),
])
def test_bad_documents_are_one_line_exit_2_nothing_written(dictionary_model_dir, tmp_path, capsys, name, data,
                                                            args, needles):
    (tmp_path / name).write_bytes(data)
    output: Path = tmp_path / f"out-{name}"
    rc, _, err = run_cli(capsys, "translate", "--model", str(dictionary_model_dir), "--input", str(tmp_path / name),
                         "--output", str(output), *args)
    assert_one_line_error(rc, err, *needles)
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == [name]
