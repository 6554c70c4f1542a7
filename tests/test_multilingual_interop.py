"""A multilingual model through every interop path (attnmt.languages): its CTranslate2 and ONNX
Runtime exports and its web page translate into each target language as the native engine does,
and an OPUS-MT model with ``>>xx<<`` target tokens (a tiny random MarianMT built here with
transformers) imports as a multilingual model that translates as transformers does and can be
fine-tuned.

The multilingual model is conftest's ``multilingual_model_dir`` (de, en, fr). Without
ctranslate2, onnxruntime, transformers, chromium or the built page the tests that need them skip.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from attnmt.data.manifest import Manifest
from attnmt.cli import main
from attnmt.config import config_from_dict
from attnmt.decode.translator import Translator
from attnmt.errors import ConfigError
from tests.conftest import GERMAN_ENGLISH, skip_without, toy_sentence

GERMAN = ["ein mann sieht ein auto", "kind spielt ball und katze", "frau fährt rot auto", "hund und katze",
          "ein groß haus", "frau sieht kind und hund spielt ball"]


def _sources(lang: str) -> list[str]:
    return [toy_sentence(g, lang) for g in GERMAN]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Native translation on one thread (these tiny models gain nothing from two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- CTranslate2 and ONNX Runtime -----------------------------------------------------------------

EXPORTS = {"ctranslate2": "ctranslate2", "onnxruntime": "onnx"}  # engine -> attnmt export's format


@pytest.fixture(scope="module")
def engines(multilingual_model_dir, tmp_path_factory):
    """(translators by engine: native and the CTranslate2 and ONNX Runtime exports that the CLI
    writes, the export directories by engine)."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")
    from attnmt.interop.engines import open_translator

    tmp = tmp_path_factory.mktemp("exports")
    translators, dirs = {"native": open_translator(multilingual_model_dir, "native", "cpu")}, {}
    for engine, fmt in EXPORTS.items():
        dirs[engine] = tmp / fmt
        assert main(["-q", "export", fmt, "--model", str(multilingual_model_dir), "--output", str(dirs[engine])]) == 0
        translators[engine] = open_translator(dirs[engine], engine, "cpu")
    for tr in translators.values():  # the stopping rule every engine has (CTranslate2 has no exact stopping)
        tr.config.decode.early_stopping = True
    return translators, dirs


@pytest.mark.parametrize("beam", [1, 4])
def test_exported_engines_translate_into_each_language_as_native(engines, beam):
    """Each direction trained, and one zero-shot (de->fr): the exports' token ids are the native ones."""
    translators, _ = engines
    for src_lang, tgt_lang in (("de", "en"), ("en", "fr"), ("en", "de"), ("de", "fr")):
        sources = _sources(src_lang)
        expected = translators["native"].translate(sources, beam_size=beam, tgt_lang=tgt_lang)
        for engine in EXPORTS:
            got = translators[engine].translate(sources, beam_size=beam, tgt_lang=tgt_lang)
            assert got[0].src_pieces[0] == f"<2{tgt_lang}>"
            assert [t.hypotheses[0].token_ids for t in got] == [t.hypotheses[0].token_ids for t in expected], \
                (engine, src_lang, tgt_lang)


def test_exported_engines_refuse_a_missing_or_unknown_language(engines):
    from attnmt.languages import LanguageError

    translators, _ = engines
    for engine in EXPORTS:
        with pytest.raises(LanguageError, match="choose one with --tgt-lang"):
            translators[engine].translate(["ein mann"])
        with pytest.raises(LanguageError, match="unknown target language 'cs'"):
            translators[engine].translate(["ein mann"], tgt_lang="cs")


def test_cli_translate_with_an_exported_engine_and_tgt_lang(engines, tmp_path, capsys):
    """``attnmt translate --engine E --model EXPORT --tgt-lang fr``: the native translations."""
    translators, dirs = engines
    expected = [t.text for t in translators["native"].translate(_sources("de"), tgt_lang="fr")]
    (tmp_path / "in.txt").write_text("\n".join(_sources("de")) + "\n", encoding="utf-8")
    for engine, export in dirs.items():
        capsys.readouterr()
        assert main(["-q", "translate", "--engine", engine, "--model", str(export), "--input",
                     str(tmp_path / "in.txt"), "--tgt-lang", "fr", "--early-stopping", "true"]) == 0
        assert capsys.readouterr().out.splitlines() == expected


# --- the web page ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def web_tests():
    """tests/test_web_export (its static server, page opener and skips), once onnxruntime is there."""
    pytest.importorskip("onnxruntime")
    from tests import test_web_export

    test_web_export._require_page()
    return test_web_export


@pytest.fixture(scope="module")
def browser(web_tests):
    skip_without("chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=web_tests.CHROMIUM, headless=True, args=web_tests.CHROMIUM_FLAGS)
        yield b
        b.close()


def _page_translation(page, tgt_lang: str | None, text: str) -> str:
    """The page's translation of ``text`` into the language chosen in its picker (None: none chosen)."""
    if tgt_lang is not None:
        page.select_option("#tgt-lang", tgt_lang)
    page.fill("#source", text)
    page.evaluate("delete document.getElementById('translation').dataset.text")
    page.click("#translate")
    page.wait_for_function("document.getElementById('translation').dataset.text !== undefined")
    return page.get_attribute("#translation", "data-text")


def test_web_page_translates_into_each_language_chosen(web_tests, browser, multilingual_model_dir, tmp_path):
    """The picker lists de, en and fr; each chosen in the page gives the native translation into it
    (beam search, the model's default), and the batch API's token ids equal the native ones."""
    site = tmp_path / "site"
    assert main(["-q", "export", "web", "--model", str(multilingual_model_dir), "--output", str(site)]) == 0
    native = Translator.from_dir(multilingual_model_dir)
    config = json.loads((site / "model" / "config.json").read_text(encoding="utf-8"))
    tags = native.src_tokenizer.piece_ids(["<2de>", "<2en>", "<2fr>"])
    assert config["target_languages"] == [{"code": c, "tag_id": t} for c, t in zip(("de", "en", "fr"), tags)]
    page, server = web_tests._open(browser, site, False)
    try:
        assert page.is_visible("#tgt-lang")
        assert page.locator("#tgt-lang option").evaluate_all("(os) => os.map((o) => o.value)") == ["de", "en", "fr"]
        assert "French" in page.locator("#tgt-lang option").all_inner_texts()[2]
        for tgt_lang, src_lang in (("de", "en"), ("en", "de"), ("fr", "en"), ("fr", "de")):
            sources = _sources(src_lang)
            expected = native.translate(sources, tgt_lang=tgt_lang)
            assert _page_translation(page, tgt_lang, sources[0]) == expected[0].text != ""
            for beam in (1, 4):
                expected = native.translate(sources, beam_size=beam, tgt_lang=tgt_lang)
                got = page.evaluate("([xs, k, lang]) => window.attnmt.translateBatch(xs, {beamSize: k, tgtLang: lang})",
                                    [sources, beam, tgt_lang])
                assert [r["tokens"] for r in got] == [t.hypotheses[0].token_ids for t in expected], (tgt_lang, beam)
                assert got[0]["srcPieces"][0] == f"<2{tgt_lang}>"
        error = page.evaluate("window.attnmt.translate('ein mann', {tgtLang: 'cs'}).catch((e) => e.message)")
        assert error == "unknown target language 'cs'; this model knows de, en, fr"
    finally:
        page.close()
        server.close()


def test_web_page_of_a_bilingual_model_has_no_picker(web_tests, browser, dictionary_model_dir, tmp_path):
    site = tmp_path / "site"
    assert main(["-q", "export", "web", "--model", str(dictionary_model_dir), "--output", str(site)]) == 0
    assert json.loads((site / "model" / "config.json").read_text(encoding="utf-8"))["target_languages"] == []
    expected = Translator.from_dir(dictionary_model_dir).translate(GERMAN[:1])[0]
    page, server = web_tests._open(browser, site, False)
    try:
        assert not page.is_visible("#tgt-lang") and page.locator("#tgt-lang option").count() == 0
        assert _page_translation(page, None, GERMAN[0]) == expected.text != ""
        assert page.evaluate("window.attnmt.translateFull(%s)" % json.dumps(GERMAN[0]))["tokens"] == \
            expected.hypotheses[0].token_ids
    finally:
        page.close()
        server.close()


# --- an OPUS-MT multilingual model ----------------------------------------------------------------

OPUS_LANGS = {"deu": "de", "fra": "fr"}  # the tiny model's >>xx<< codes and the toy task's languages
LIMIT = 40  # output tokens, EOS included


def _spm(lines: list[str], vocab_size: int) -> bytes:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return buf.getvalue()


def save_tiny_opus_mul(hf_dir: Path):
    """A tiny random MarianMTModel from English into German and French in OPUS-MT's way: the
    vocabulary holds ``>>deu<<`` and ``>>fra<<``, which the source SentencePiece model does not
    know (transformers' MarianTokenizer splits them off the text). Saved as a Hugging Face
    directory ``hf_dir``; returns the model in eval mode."""
    pytest.importorskip("transformers")
    from tests.test_interop_marian import save_marian  # imported here: that module skips without transformers

    rng, words = random.Random(5), sorted(GERMAN_ENGLISH)
    german = [" ".join(rng.sample(words, rng.randint(2, 6))) for _ in range(300)]
    protos = (_spm([toy_sentence(g, "en") for g in german], 40),
              _spm([toy_sentence(g, lang) for g in german for lang in OPUS_LANGS.values()], 60))
    return save_marian(hf_dir, protos, special=(">>deu<<", ">>fra<<"), max_positions=64).eval()


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    """(MarianMT directory, the transformers model, its attnmt import)."""

    hf_dir = tmp_path_factory.mktemp("opus-mt-en-mul")
    model = save_tiny_opus_mul(hf_dir)
    imported = tmp_path_factory.mktemp("imported") / "model"
    assert main(["-q", "import", "marian", str(hf_dir), "--output", str(imported)]) == 0
    return hf_dir, model, imported


def test_opus_target_tokens_become_target_languages(opus):
    from attnmt.interop.marian import target_languages

    _, _, imported = opus
    tokenizer = yaml.safe_load((imported / "config.yaml").read_text(encoding="utf-8"))["tokenizer"]
    assert tokenizer["target_languages"] == ["deu", "fra"] and tokenizer["language_tag"] == ">>{}<<"
    assert target_languages(["</s>", ">>pt_BR<<", ">>fra<<", ">>zh-Hans<<", ">><<", "▁>>"]) == ["fra", "pt_BR"]
    assert target_languages(["</s>", "<unk>", "▁a"]) == []  # a model into one language: no tags


def test_opus_import_translates_as_transformers_with_the_tag(opus):
    """Greedy search with tgt_lang fra / deu: transformers' generate() on '>>fra<< text' (the tag's
    id first, then the text's pieces), token for token, up to the limit of LIMIT tokens, where
    both cut the output without EOS."""
    transformers = pytest.importorskip("transformers")
    hf_dir, hf_model, imported = opus
    tr = Translator.from_dir(imported)
    tr.config.decode.max_len_a, tr.config.decode.max_len_b = 0.0, LIMIT
    hf_tok = transformers.MarianTokenizer(str(hf_dir / "source.spm"), str(hf_dir / "target.spm"),
                                          str(hf_dir / "vocab.json"))
    hf_pieces = {i: p for p, i in json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8")).items()}
    sentences = [toy_sentence(g, "en") for g in GERMAN + ["mann fährt auto", "katze sieht hund", "ein kind"]]
    lengths = set()
    for code in OPUS_LANGS:
        results = tr.translate(sentences, beam_size=1, tgt_lang=code)
        batch = hf_tok([f">>{code}<< {s}" for s in sentences], return_tensors="pt", padding=True)
        ours = tr.encode_sources(sentences, code)
        assert [tr.src_tokenizer.pieces(ids) for ids in ours] == [
            [hf_pieces[i] for i in row.tolist() if i != hf_model.config.pad_token_id] for row in batch["input_ids"]]
        assert results[0].src_pieces[0] == f">>{code}<<"
        with torch.no_grad():
            gen = hf_model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=LIMIT,
                                    bad_words_ids=[[hf_model.config.pad_token_id]])
        for row, result in zip(gen, results):
            expected = [hf_pieces[i] for i in row[1:].tolist() if i != hf_model.config.pad_token_id]
            assert result.hypotheses[0].pieces == expected, (code, result.text)
            lengths.add(len(expected))
    assert len(lengths) >= 3 and LIMIT in lengths  # short outputs, and some at the limit


def test_opus_web_export_lists_the_tags(opus, tmp_path):
    pytest.importorskip("onnxruntime")
    from tests.test_web_export import _require_page

    _require_page()
    _, _, imported = opus
    assert main(["-q", "export", "web", "--model", str(imported), "--output", str(tmp_path / "site")]) == 0
    config = json.loads((tmp_path / "site" / "model" / "config.json").read_text(encoding="utf-8"))
    vocab = json.loads((imported / "vocab.json").read_text(encoding="utf-8"))
    assert config["target_languages"] == [{"code": c, "tag_id": vocab.index(f">>{c}<<")} for c in ("deu", "fra")]


def test_finetuning_an_opus_model_keeps_its_languages(opus, tmp_path):
    """A run from the imported model (train.init_from) on an English->French corpus: it inherits
    target_languages and the tag, its prepared sources start with >>fra<<, and it trains; a corpus
    into a language the model lacks is refused."""
    from attnmt.data import shards
    from attnmt.train.loop import train

    _, _, imported = opus
    rng, words = random.Random(9), sorted(GERMAN_ENGLISH)
    german = [" ".join(rng.sample(words, rng.randint(2, 5))) for _ in range(120)]
    for lang in ("en", "fr"):
        (tmp_path / f"train.{lang}").write_text("\n".join(toy_sentence(g, lang) for g in german) + "\n",
                                               encoding="utf-8")
    raw = {"data": {"train": [{"src": str(tmp_path / "train.en"), "tgt": str(tmp_path / "train.fr"),
                               "src_lang": "eng", "tgt_lang": "fra"}], "max_len": 40},
           "train": {"init_from": str(imported), "max_steps": 8, "batch_tokens": 400, "lr": 0.003,
                     "schedule": "inverse_sqrt", "warmup_steps": 2, "log_every": 1, "valid_every": 8,
                     "device": "cpu", "num_threads": 1}}
    run = tmp_path / "run"
    train(config_from_dict(raw), run, progress=False)
    tokenizer = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))["tokenizer"]
    assert tokenizer["target_languages"] == ["deu", "fra"] and tokenizer["language_tag"] == ">>{}<<"
    tr = Translator.from_dir(run)
    [tag] = tr.src_tokenizer.piece_ids([">>fra<<"])
    manifest = Manifest.load(run / "data")
    pairs = manifest.train.corpora[0].pairs
    src, _ = shards.ShardedCorpus(run / "data", "train", manifest).pairs(range(pairs))
    assert pairs == len(german) and {int(s[0]) for s in src} == {tag}
    losses = [json.loads(line)["loss"] for line in (run / "train_log.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "train"]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert tr.translate([toy_sentence(german[0], "en")], tgt_lang="fra")[0].src_pieces[0] == ">>fra<<"
    raw["data"]["train"][0]["tgt_lang"] = "spa"
    with pytest.raises(ConfigError, match="'spa'.*deu, fra"):
        train(config_from_dict(raw), tmp_path / "run2", progress=False)
