"""Import of a MarianMT model, checked against transformers itself (offline).

A tiny random MarianMTModel (2 + 2 layers) is built with transformers, with SentencePiece models
and a shared vocab.json trained here on Multi30k lines, saved as a Hugging Face directory and
imported. attnmt must give transformers' logits, and its beam search transformers' generate().
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
import torch

from attnmt.cli import main
from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.decode.translator import Translator
from attnmt.errors import CheckpointError
from attnmt.interop.marian import import_marian, vocabulary_order
from tests.conftest import multi30k_data

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

EOS_BIAS = 2.0  # added to the random final logits bias, so that many outputs end before the limit
LIMIT = 100  # output tokens, EOS included (below max_position_embeddings)


def _data_dir() -> Path:
    """Multi30k from $ATTNMT_DATA (skips where absent)."""
    root = multi30k_data()
    if root is None:
        pytest.skip("Multi30k not found: set ATTNMT_DATA to the directory holding multi30k/")
    return root


def _lines(data_dir, lang, n):
    with gzip.open(data_dir / "multi30k" / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _spm(lines, vocab_size):
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
                                   model_type="unigram", minloglevel=2, num_threads=1)
    return buf.getvalue()


def save_marian(hf_dir: Path, protos: tuple[bytes, bytes], special: tuple[str, ...] = (), max_positions: int = 128,
                logits_bias_std: float | None = None):
    """Build a tiny random MarianMTModel (2 + 2 layers, d_model 32) with the source and target
    SentencePiece models ``protos`` and MarianMT's shared vocab.json (EOS 0, unk 1, the tokens
    ``special``, the pieces of both models, pad last), save it as a Hugging Face directory
    ``hf_dir`` and return it (training mode). Its weight matrices are drawn from N(0, 0.3) for
    peaked distributions (few near ties in search); with ``logits_bias_std`` the final logits
    bias is drawn from N(0, ``logits_bias_std``) and EOS's raised by ``EOS_BIAS``."""
    (hf_dir / "source.spm").write_bytes(protos[0])
    (hf_dir / "target.spm").write_bytes(protos[1])
    pieces = ["</s>", "<unk>", *special]
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [p for p in (sp.id_to_piece(i) for i in range(3, len(sp))) if p not in pieces]
    pieces.append("<pad>")
    (hf_dir / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}), encoding="utf-8")
    pad = len(pieces) - 1
    config = transformers.MarianConfig(
        vocab_size=len(pieces), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
        max_position_embeddings=max_positions, scale_embedding=True, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=None, dropout=0.1)
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed_positions" not in name:  # the sinusoids stay
                p.normal_(0.0, 0.3)
        if logits_bias_std is not None:
            if logits_bias_std:
                model.final_logits_bias.normal_(0.0, logits_bias_std)
            model.final_logits_bias[0, 0] += EOS_BIAS
    model.save_pretrained(hf_dir)
    return model


def save_tiny_marian(hf_dir: Path, source: list[str], target: list[str], logits_bias_std: float = 1.0):
    """:func:`save_marian` with SentencePiece models of 150 pieces trained on ``source`` and
    ``target``, the final logits bias drawn from N(0, ``logits_bias_std``), EOS's raised."""
    return save_marian(hf_dir, (_spm(source, 150), _spm(target, 150)), logits_bias_std=logits_bias_std)


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """(MarianMT directory, the transformers model in eval mode, source sentences)."""
    data_dir = _data_dir()
    source, target = _lines(data_dir, "de", 400), _lines(data_dir, "en", 400)
    hf_dir = tmp_path_factory.mktemp("marian")
    model = save_tiny_marian(hf_dir, source, target)
    return hf_dir, model.eval(), _lines(data_dir, "de", 430)[400:]


def _hf_tokenizer(hf_dir):
    return transformers.MarianTokenizer(str(hf_dir / "source.spm"), str(hf_dir / "target.spm"),
                                        str(hf_dir / "vocab.json"))


def _hf_batch(hf_dir, sentences):
    return _hf_tokenizer(hf_dir)(sentences, return_tensors="pt", padding=True)


def test_vocabulary_order_puts_marian_specials_on_attnmt_ids():
    order, pieces = vocabulary_order({"</s>": 0, "<unk>": 1, "a": 2, "b": 3, "<pad>": 4}, 5, pad_id=4, eos_id=0)
    assert order == [4, 1, 2, 0, 3] and pieces == ["<pad>", "<unk>", "a", "</s>", "b"]
    with pytest.raises(CheckpointError):
        vocabulary_order({"</s>": 0, "a": 1}, 2, pad_id=1, eos_id=0)


def test_imported_logits_equal_transformers(marian, tmp_path):
    """A padded batch: attnmt's logits (vocabulary reordered) equal transformers' within 1e-4,
    and attnmt's source ids are the ids of transformers' MarianTokenizer."""
    hf_dir, hf_model, sentences = marian
    out = import_marian(str(hf_dir), tmp_path / "model")
    tr = Translator.from_dir(out)
    order = torch.tensor(vocabulary_order(json.loads((hf_dir / "vocab.json").read_text()),
                                          hf_model.config.vocab_size, hf_model.config.pad_token_id, 0)[0])
    new_id = torch.empty_like(order)
    new_id[order] = torch.arange(len(order))
    batch = _hf_batch(hf_dir, sentences[:6])
    src = new_id[batch["input_ids"]] * batch["attention_mask"]  # HF's pad -> attnmt's 0
    ours = [s + [EOS_ID] for s in tr.src_tokenizer.encode_batch(sentences[:6])]
    assert [row[row != PAD_ID].tolist() for row in src] == ours
    tgt_hf = torch.randint(1, len(order) - 1, (6, 9))
    tgt_hf[:, 0] = hf_model.config.decoder_start_token_id
    with torch.no_grad():
        expected = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            decoder_input_ids=tgt_hf).logits[..., order]
        got = tr.model(src, new_id[tgt_hf])
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-4


def test_imported_beam_search_equals_generate(marian, tmp_path):
    """Beam search (K = 4) gives generate(num_beams=4)'s tokens and scores, on every sentence of
    30 that generate ends with EOS before the limit (at least a dozen, of varied lengths).

    The length penalty that makes the two searches the same is none: attnmt's alpha = 0 and
    transformers' length_penalty = 0 both rank by log P(Y | X), and both stop a sentence exactly
    when no open beam can beat its finished ones (with a length penalty, transformers' default
    stopping rule is a heuristic that can stop earlier). At the length limit they differ:
    attnmt ends every hypothesis with EOS, transformers keeps them without it."""
    hf_dir, hf_model, sentences = marian
    out = import_marian(str(hf_dir), tmp_path / "model")
    tr = Translator.from_dir(out)
    tr.config.decode.max_len_a, tr.config.decode.max_len_b = 0.0, LIMIT
    batch = _hf_batch(hf_dir, sentences)
    with torch.no_grad():
        gen = hf_model.generate(**batch, num_beams=4, length_penalty=0.0, max_new_tokens=LIMIT, do_sample=False,
                                bad_words_ids=[[hf_model.config.pad_token_id]], early_stopping=False,
                                output_scores=True, return_dict_in_generate=True)
    pieces = json.loads((out / "vocab.json").read_text())
    hf_pieces = {i: p for p, i in json.loads((hf_dir / "vocab.json").read_text()).items()}
    results = tr.translate(sentences, beam_size=4, length_penalty=0.0)
    lengths = []
    for row, score, result in zip(gen.sequences, gen.sequences_scores, results):
        expected = [hf_pieces[i] for i in row[1:].tolist() if i != hf_model.config.pad_token_id]
        if expected[-1] != "</s>" or len(expected) >= LIMIT:
            continue  # stopped by the limit
        hyp = result.hypotheses[0]
        assert [pieces[i] for i in hyp.token_ids] == expected
        assert hyp.score == pytest.approx(score.item(), abs=1e-4)
        lengths.append(len(expected))
    assert len(lengths) >= 12 and len(set(lengths)) >= 3, lengths


def test_import_refuses_pickles_and_missing_files(marian, tmp_path, capsys):
    """pytorch_model.bin is read with weights_only=True: a pickle with code is refused; a folder
    without config.json is a one-line CLI error."""
    hf_dir, _, _ = marian
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("config.json", "vocab.json", "source.spm", "target.spm"):
        (bad / name).write_bytes((hf_dir / name).read_bytes())
    torch.save({"x": torch.zeros(1), "f": print}, bad / "pytorch_model.bin")  # a pickled function
    with pytest.raises(CheckpointError, match="safely"):
        import_marian(str(bad), tmp_path / "out")
    assert main(["import", "marian", str(tmp_path / "nowhere"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnmt: error:") and "\n" not in err
