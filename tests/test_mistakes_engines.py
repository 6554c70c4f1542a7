"""Numbers, lengths and text that reach an engine's library: each mistake ends in one line on
stderr and exit 2 (or a 4xx over HTTP) naming the flag, key or value, before the library is
called; and a user's text never carries a reserved symbol (a language tag, ``</s>``, ``<pad>``)
into the model, whatever the path."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from attnmt.config import config_from_dict
from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, VocabTokenizer
from attnmt.decode.engine import PositionError
from attnmt.decode.translator import Translator
from attnmt.search.options import C_INT_MAX, SearchOptions
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import GERMAN_ENGLISH, skip_without, tiny_model, wait_ready
from tests.test_hardening import assert_one_line_error, run_cli
from tests.test_mistakes import export_engines

HUGE = str(2**64)  # 18446744073709551616: one past what a size_t holds
RESERVED_TEXT = ["<2fr>", "</s>", "<unk>", "<pad>", "<s>"]


@pytest.fixture(scope="module")
def exports(tiny_run, tmp_path_factory) -> dict[str, Path]:
    """The tiny model exported for CTranslate2 and ONNX Runtime (where installed), plus itself
    as the native engine's directory."""
    return {"native": tiny_run, **export_engines(tiny_run, tmp_path_factory.mktemp("engine_exports"))}


def engine_dir(exports: dict[str, Path], engine: str) -> Path:
    if engine not in exports:
        pytest.skip(f"no {engine}: pip install 'attnmt[export]'")
    return exports[engine]


def existing_output(tmp_path: Path) -> Path:
    """An output file a failed command must leave as it is."""
    out = tmp_path / "out.txt"
    out.write_text("translated earlier\n")
    return out


def edited_decode(model_dir: Path, root: Path, **decode) -> Path:
    """A copy of a model (or export) directory whose config.yaml sets ``decode`` keys."""
    d = root / "edited"
    shutil.copytree(model_dir, d, ignore=shutil.ignore_patterns("checkpoints", "data"))
    raw = yaml.safe_load((d / "config.yaml").read_text())
    raw["decode"].update(decode)
    (d / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return d


# ---- numbers handed to an engine's library ------------------------------------------------------


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("flag,value", [("--inter-threads", HUGE), ("--threads", HUGE),
                                        ("--threads", str(C_INT_MAX + 1))])
def test_translate_thread_counts_out_of_range_are_one_line(tiny_run, tmp_path, capsys, engine, flag, value):
    (tmp_path / "in.txt").write_text("alpha\n")
    out = existing_output(tmp_path)
    rc, stdout, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--engine", engine, flag, value,
                              "--input", str(tmp_path / "in.txt"), "--output", str(out))
    assert_one_line_error(rc, err, flag, value, str(C_INT_MAX))
    assert out.read_text() == "translated earlier\n" and stdout == ""


@pytest.mark.parametrize("command,flag", [("translate", "--beam-size"), ("translate", "--batch-size"),
                                          ("translate", "--nbest"), ("evaluate", "--beam-size"),
                                          ("score", "--batch-size"), ("serve", "--threads"),
                                          ("plot-attention", "--beam-size")])
def test_other_counts_out_of_range_are_one_line(tiny_run, capsys, command, flag):
    rc, _, err = run_cli(capsys, command, "--model", str(tiny_run), flag, HUGE)
    assert_one_line_error(rc, err, flag, HUGE)


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("name", ["threads", "inter_threads"])
def test_open_translator_refuses_huge_thread_counts_first(tmp_path, engine, name):
    from attnmt.interop.engines import open_translator

    # an empty directory: the check comes before anything is read
    message = rf"^{name} {2**64} is out of range: use a whole number from [01] to {C_INT_MAX}$"
    with pytest.raises(ValueError, match=message):
        open_translator(tmp_path, engine, "cpu", **{name: 2**64})


def test_engines_refuse_huge_thread_counts_in_their_constructors(tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")
    from attnmt.interop.ctranslate2_engine import CTranslate2Engine
    from attnmt.interop.onnx import OnnxTransformer

    with pytest.raises(ValueError, match="^inter_threads 18446744073709551616 is out of range"):
        CTranslate2Engine(tmp_path, inter_threads=2**64)
    with pytest.raises(ValueError, match="^threads -1 is out of range: use a whole number from 0"):
        CTranslate2Engine(tmp_path, threads=-1)
    with pytest.raises(ValueError, match=f"^threads {2**40} is out of range"):
        OnnxTransformer(tmp_path, None, threads=2**40)


DECODE_KEYS = [({"beam_size": 2**64}, "beam_size"), ({"max_len_b": 10**30}, "max_len_b"),
               ({"max_len_a": 1e300}, "max_len_a"),
               ({"early_stopping": True, "patience": 1e300}, "patience")]


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("decode,key", DECODE_KEYS, ids=[k for _, k in DECODE_KEYS])
def test_config_numbers_out_of_range_are_one_line(exports, tmp_path, capsys, engine, decode, key):
    model = edited_decode(engine_dir(exports, engine), tmp_path, **decode)
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    out = existing_output(tmp_path)
    rc, _, err = run_cli(capsys, "translate", "--model", str(model), "--engine", engine,
                         "--input", str(tmp_path / "in.txt"), "--output", str(out))
    assert_one_line_error(rc, err, key, "out of range")
    assert out.read_text() == "translated earlier\n"


def test_patience_flag_too_large_for_the_hypothesis_count_is_one_line(tiny_run, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, _, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                         "--early-stopping", "true", "--patience", "1e300")
    assert_one_line_error(rc, err, "patience", "1e+300", str(C_INT_MAX))


def test_search_options_ranges():
    assert SearchOptions(beam_size=C_INT_MAX, nbest=1).beam_size == C_INT_MAX
    for bad in (dict(beam_size=C_INT_MAX + 1), dict(max_len_b=2**63), dict(max_len_a=float("inf")),
                dict(length_penalty=float("nan")), dict(patience=C_INT_MAX / 2, beam_size=4, early_stopping=True)):
        with pytest.raises(ValueError, match=f"^{next(iter(bad))} .*out of range"):
            SearchOptions(**bad)


@pytest.fixture(scope="module")
def clients(exports):
    """A test client per engine over the tiny model (a large beam limit, so that the search
    options' own ranges are what refuses)."""
    from attnmt.interop.engines import open_translator

    settings = ServeSettings(max_beam_size=C_INT_MAX)
    opened = {}
    with contextlib.ExitStack() as stack:
        for engine, d in exports.items():
            c = stack.enter_context(TestClient(create_app(lambda d=d, e=engine: open_translator(d, e, "cpu"),
                                                          settings)))
            wait_ready(c)
            opened[engine] = c
        yield opened


HTTP_BODIES = [({"text": "alpha", "beam_size": 2**40}, "beam_size"),
               ({"text": "alpha", "early_stopping": True, "patience": 1e300}, "patience"),
               ({"text": "alpha", "beam_size": 4, "nbest": 2**64}, "nbest")]


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("body,field", HTTP_BODIES, ids=[f for _, f in HTTP_BODIES])
def test_http_numbers_out_of_range_are_422(clients, engine, body, field):
    if engine not in clients:
        pytest.skip(f"no {engine}")
    r = clients[engine].post("/v1/translate", json=body)
    assert r.status_code == 422, r.text
    assert field in json.dumps(r.json()["detail"])  # a message, or pydantic's errors with the field's loc


# ---- lengths past the model's positions ---------------------------------------------------------


def long_pairs(tmp_path: Path) -> tuple[Path, Path]:
    """A short source with a target of 300 words (more subwords than the tiny model's 128 positions)."""
    (tmp_path / "src.txt").write_text("alpha bravo\nalpha\n")
    (tmp_path / "tgt.txt").write_text("alpha bravo\n" + " ".join(["charlie delta"] * 150) + "\n")
    return tmp_path / "src.txt", tmp_path / "tgt.txt"


def test_score_with_a_target_past_the_positions_is_the_same_line_for_every_engine(exports, tmp_path, capsys):
    src, tgt = long_pairs(tmp_path)
    lines = {}
    for engine in ("native", "ctranslate2"):
        out = existing_output(tmp_path)
        rc, _, err = run_cli(capsys, "score", "--model", str(engine_dir(exports, engine)), "--engine", engine,
                             "--src", str(src), "--tgt", str(tgt), "--output", str(out))
        assert_one_line_error(rc, err, "target sentence 2", "exceeds max_positions 128")
        assert out.read_text() == "translated earlier\n"
        lines[engine] = err
    assert lines["native"] == lines["ctranslate2"]


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
def test_sources_past_the_positions_are_refused_before_the_engine(exports, engine):
    from attnmt.interop.engines import open_translator

    tr = open_translator(engine_dir(exports, engine), engine, "cpu")
    ids = tr.encode_sources(["alpha"])[0]
    with pytest.raises(PositionError, match=r"^source sentence 2: position 128 exceeds max_positions 128"):
        tr.translate_ids([ids, ids[:1] * 128 + [EOS_ID]], tr.options(early_stopping=True))
    with pytest.raises(PositionError, match=r"^source sentence 1: position 129 exceeds max_positions 128"):
        tr.engine.translate([ids[:1] * 129 + [EOS_ID]], tr.options(early_stopping=True))


def test_ctranslate2_forced_decoding_checks_both_sides(exports):
    from attnmt.interop.engines import open_translator

    tr = open_translator(engine_dir(exports, "ctranslate2"), "ctranslate2", "cpu")
    ids = tr.encode_sources(["alpha"])[0]
    long = ids[:1] * 200 + [EOS_ID]
    with pytest.raises(PositionError, match="^target sentence 1: position 200 exceeds max_positions 128"):
        tr.engine.forced_log_probs([ids], [long])
    with pytest.raises(PositionError, match="^source sentence 1: position 200 exceeds max_positions 128"):
        tr.engine.forced_log_probs([long], [ids])
    assert len(tr.engine.forced_log_probs([ids], [ids[:1] * 127 + [EOS_ID]])[0]) == 128  # the longest that fits


# ---- reserved symbols in user text ---------------------------------------------------------------


TOY = [" ".join(GERMAN_ENGLISH)[i:i + 40] for i in range(0, 200, 7)] + ["a < b > c / d 2", "x <> y </ z"] * 10


@pytest.fixture(scope="module")
def tagged() -> Translator:
    """A multilingual translator (tags <2de>, <2en>, <2fr>) over a random tiny model: the
    tokenizer knows '<', '>' and '/', so text spelling a reserved symbol has no unknown piece."""
    tok = Tokenizer.train(TOY * 5, 90, "bpe", user_symbols=["<2de>", "<2en>", "<2fr>"])
    config = config_from_dict({"tokenizer": {"vocab_size": 90, "model_type": "bpe",
                                             "target_languages": ["de", "en", "fr"]},
                               "model": {"d_model": 16, "num_heads": 2, "d_ff": 32, "num_encoder_layers": 1,
                                         "num_decoder_layers": 1, "dropout": 0.0, "max_positions": 64},
                               "decode": {"beam_size": 2, "max_len_b": 3}})
    model = tiny_model(vocab=len(tok), d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                       num_decoder_layers=1, max_positions=64)
    return Translator(model, tok, tok, config, device="cpu")


def reserved_ids(tr: Translator) -> set[int]:
    return {PAD_ID, BOS_ID, EOS_ID, UNK_ID, *tr.src_tokenizer.piece_ids(["<2de>", "<2en>", "<2fr>"])}


@pytest.mark.parametrize("symbol", RESERVED_TEXT)
def test_reserved_symbols_in_text_are_ordinary_pieces(tagged, symbol):
    text = f"{symbol} ein hund"
    [ids] = tagged.encode_sources([text], "en")
    assert ids[0] == tagged.src_tokenizer.piece_ids(["<2en>"])[0] and ids[-1] == EOS_ID
    assert not set(ids[1:-1]) & reserved_ids(tagged), tagged.src_tokenizer.pieces(ids)
    assert tagged.src_tokenizer.decode(ids[1:-1]) == text  # its own characters, nothing else
    assert len(ids[1:-1]) > len(tagged.src_tokenizer.encode("ein hund")) + 1  # the symbol is several pieces


def test_ordinary_text_encodes_as_before(tagged):
    import sentencepiece as spm

    lines = TOY + ["ein mann sieht den hund .", "Hund, Katze & Maus!", "x y z"]
    plain = spm.SentencePieceProcessor(model_proto=tagged.src_tokenizer.model_proto)
    assert tagged.src_tokenizer.encode_batch(lines) == plain.encode(lines)
    assert plain.encode("<2fr> ein")[1] == tagged.src_tokenizer.piece_ids(["<2fr>"])[0]  # what the model file does


def test_translate_and_score_see_no_tag_in_text(tagged):
    [result] = tagged.translate(["<2fr> ein hund"], tgt_lang="en")
    assert result.src_pieces[0] == "<2en>" and "<2fr>" not in result.src_pieces
    [scored] = tagged.score(["ein hund"], ["</s> a dog <2fr>"], tgt_lang="en")
    body = scored.token_ids[:-1]
    assert scored.token_ids[-1] == EOS_ID and not set(body) & reserved_ids(tagged)


def test_http_and_libretranslate_encode_a_tag_in_text_as_text(tagged):
    seen: list[str] = []
    encode = tagged.encode_sources

    def spy(sentences, tgt_lang=None):
        seen.extend(sentences)
        return encode(sentences, tgt_lang)

    with TestClient(create_app(lambda: tagged)) as client:
        wait_ready(client)
        r = client.post("/v1/translate", json={"text": "<2fr> Ein Hund.", "tgt_lang": "en", "return_attention": True})
        assert r.status_code == 200, r.text
        tokens = r.json()["translations"][0]["attention"]["src_tokens"]
        assert tokens[0] == "<2en>" and tokens[-1] == "</s>" and "<2fr>" not in tokens and tokens.count("</s>") == 1
        tagged.encode_sources = spy
        try:
            r = client.post("/translate", json={"q": "</s> <2fr> ein", "source": "de", "target": "en"})
        finally:
            del tagged.encode_sources
        assert r.status_code == 200, r.text
    [ids] = encode(seen, "en")
    assert seen == ["</s> <2fr> ein"] and not set(ids[1:-1]) & reserved_ids(tagged)


def test_word_tokenizer_maps_a_word_spelled_like_a_special_to_unk():
    pytest.importorskip("spacy")
    pytest.importorskip("sacremoses")
    from attnmt.data.tokenizers import WordTokenizer

    tok = WordTokenizer(["ein", "hund"], "de")
    for symbol in ("</s>", "<pad>", "<s>"):
        ids = tok.encode(f"ein {symbol} hund")
        assert ids[0] == 4 and ids[-1] == 5 and not {PAD_ID, BOS_ID, EOS_ID} & set(ids), (symbol, ids)


def test_imported_vocabulary_never_receives_a_reserved_piece():
    # a SentencePiece model that knows digits only: letters and '<>/' are unknown, and an unknown
    # stretch comes out as its own text, which must not be looked up among the reserved pieces
    sp = Tokenizer.train(["1 2 3 12 23 31 123"] * 20, 12, "bpe")
    pieces = sp.pieces(list(range(len(sp))))
    vocab = ["<pad>", "<unk>", "▁", "</s>", ">>fra<<", *[p for p in pieces[4:] if p != "▁"]]
    tok = VocabTokenizer(sp.model_proto, vocab)
    ids = tok.encode("</s> >>fra<< 12 <pad>")
    assert not {PAD_ID, EOS_ID, 4} & set(ids), tok.pieces(ids)
    assert UNK_ID in ids and tok.encode("12") == [tok.piece_ids([p])[0] for p in sp.pieces(sp.encode("12"))]


def test_web_page_tokenizer_encodes_a_tag_in_text_as_text(tagged, tmp_path):
    web = Path(__file__).resolve().parents[1] / "src" / "attnmt" / "web"
    skip_without("node", "packages")
    from attnmt.interop.web import _tokenizer_files

    files = _tokenizer_files(tmp_path, tagged.src_tokenizer, tagged.tgt_tokenizer, tmp_path)
    lines = ["<2fr> ein hund", "</s> <pad> ein", "ein mann sieht den hund ."]
    run = subprocess.run(["node", str(web / "tools" / "encode.mjs"), str(tmp_path / files["src_model"])],
                         input="\n".join(json.dumps(x) for x in lines) + "\n", capture_output=True, text=True,
                         timeout=120, check=True)
    assert [json.loads(x) for x in run.stdout.splitlines()] == tagged.src_tokenizer.encode_batch(lines)


def test_web_page_tokenizer_of_an_imported_model_never_receives_a_reserved_piece(tmp_path):
    web = Path(__file__).resolve().parents[1] / "src" / "attnmt" / "web"
    skip_without("node", "packages")
    sp = Tokenizer.train(["1 2 3 12 23 31 123"] * 20, 12, "bpe")
    vocab = ["<pad>", "<unk>", "▁", "</s>", ">>fra<<", *[p for p in sp.pieces(list(range(4, len(sp)))) if p != "▁"]]
    (tmp_path / "m.model").write_bytes(sp.model_proto)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    lines = ["</s> >>fra<< 12 <pad>", "<unk> 3"]
    run = subprocess.run(["node", str(web / "tools" / "encode.mjs"), str(tmp_path / "m.model"),
                          str(tmp_path / "vocab.json"), "--mapped"],
                         input="\n".join(json.dumps(x) for x in lines) + "\n", capture_output=True, text=True,
                         timeout=120, check=True)
    ours = [json.loads(x) for x in run.stdout.splitlines()]
    assert ours == VocabTokenizer(sp.model_proto, vocab).encode_batch(lines)
    assert not {PAD_ID, EOS_ID, 4} & {i for ids in ours for i in ids} and UNK_ID in ours[0]
