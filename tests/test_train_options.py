"""The data, training and decoding options of the reference presets, one test each: the
word-level tokenizer (lowercase, min_freq, max_vocab, token filter, vocabulary limited to words
with a vector, detokenization, JSON vocabulary), .vec files, batches by sentences, per-epoch
reports and checkpoints, per-sentence loss, SGD with Nesterov momentum, cosine decay with warm
restarts, the time-budget schedule and the average log-probability score."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from attnmt import rundir
from attnmt.config import config_from_dict
from attnmt.data.batching import batch_from_arrays, sentence_batches
from attnmt.data.tokenizers import PAD_ID, UNK_ID, WordTokenizer
from attnmt.data.vectors import read_vec, write_vec
from attnmt.decode.translator import Translator
from attnmt.errors import DataError
from attnmt.train.losses import per_sentence_label_smoothed_cross_entropy
from attnmt.train.schedules import cosine_restarts_lr, expected_updates, time_budget_lr
from attnmt.train.loop import TrainingRun

from .conftest import tiny_model

WORDS = ["haus", "katze", "hund", "baum", "auto", "ball", "tisch", "stuhl", "fenster", "garten"]


# ---- word-level tokenizer -----------------------------------------------------------------------

def test_word_tokenizer_lowercase():
    assert WordTokenizer([], "de", lowercase=True).tokenize(["Ein Mann, der läuft."]) == [
        ["ein", "mann", ",", "der", "läuft", "."]]
    assert WordTokenizer([], "de").tokenize(["Ein Mann"]) == [["Ein", "Mann"]]


def test_word_tokenizer_min_freq_and_unknown_words():
    tok = WordTokenizer.train(["a b b c c c", "c"], "en", min_freq=2)
    assert tok.words == ["c", "b"]  # most frequent first
    assert tok.encode("c b a") == [4, 5, UNK_ID]


def test_word_tokenizer_max_vocab_keeps_the_most_frequent():
    tok = WordTokenizer.train(["a b b c c c d d d d"], "en", max_vocab=2)
    assert tok.words == ["d", "c"]


def test_word_tokenizer_alpha_punct_filter():
    tok = WordTokenizer([], "en", token_filter="alpha_punct")
    assert tok.tokenize(["A man (42) runs: fast, now!"]) == [["A", "man", "runs", "fast", ",", "now"]]


def test_word_vocabulary_limited_to_words_with_vectors():
    tok = WordTokenizer.train(["a b b c c c"], "en", allowed={"a", "b"})
    assert tok.words == ["b", "a"]


def test_word_tokenizer_detokenizes_with_moses():
    tok = WordTokenizer(["a", "man", ",", "running", "."], "en")
    assert tok.decode([2, 4, 5, 6, 7, 8, 3]) == "a man, running."


def test_word_vocabulary_saved_as_json_in_the_model_directory(tmp_path):
    src = WordTokenizer.train(["Ein Haus ."], "de", lowercase=True, token_filter="alpha_punct")
    tgt = WordTokenizer.train(["A house ."], "en")
    rundir.write_tokenizers(tmp_path, src, tgt)
    data = json.loads((tmp_path / "src.vocab.json").read_text())
    assert data == {"kind": "word", "lang": "de", "lowercase": True, "token_filter": "alpha_punct",
                    "words": [".", "ein", "haus"]}
    src2, tgt2 = rundir.read_tokenizers(tmp_path)
    assert src2.encode("EIN Haus") == src.encode("EIN Haus") and tgt2.words == tgt.words


# ---- .vec files ---------------------------------------------------------------------------------

def test_vec_files_round_trip_and_name_bad_lines(tmp_path):
    path = tmp_path / "v.vec"
    write_vec(path, {"haus": [0.5, -1.0, 2.0], "katze": [1.0, 0.0, 0.25]})
    assert path.read_text().splitlines()[0] == "2 3"
    vectors = read_vec(path, {"katze", "hund"})
    assert list(vectors) == ["katze"] and torch.equal(vectors["katze"], torch.tensor([1.0, 0.0, 0.25]))
    path.write_text("2 3\nhaus 1 2 3\nkatze 1 2\n")
    with pytest.raises(DataError, match=r"v.vec:3: expected a word and 3 numbers"):
        read_vec(path)


def test_train_vectors_cli_writes_a_vec_file_of_tokenized_words(tmp_path):
    rng = random.Random(0)
    lines = [" ".join(rng.choices([w.capitalize() for w in WORDS], k=6)) + "." for _ in range(300)]
    for side in ("src", "tgt"):
        (tmp_path / f"train.{side}").write_text("\n".join(lines) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train_src: {tmp_path}/train.src, train_tgt: {tmp_path}/train.tgt}}\n"
                      "tokenizer: {kind: word, joint: false, lowercase: true, token_filter: alpha_punct, "
                      "src_lang: de, tgt_lang: en}\nmodel: {d_model: 16, num_heads: 2}\n")
    out = tmp_path / "de.vec"
    proc = subprocess.run([sys.executable, "-m", "attnmt", "-q", "train-vectors", str(config), "--side", "src",
                           "--output", str(out), "--epochs", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    vectors = read_vec(out)
    assert set(vectors) == set(WORDS) | {"."}  # lowercased tokens, as the word tokenizer makes them
    assert all(v.shape == (16,) for v in vectors.values())


# ---- batches, loss, schedules -------------------------------------------------------------------

def test_sentence_batches_count_sentences():
    lengths = [(random.Random(i).randint(2, 30), random.Random(-i).randint(2, 30)) for i in range(103)]
    batches = sentence_batches(lengths, 10, seed=1, epoch=0)
    assert sorted(len(b) for b in batches) == [3] + [10] * 10
    assert sorted(i for b in batches for i in b) == list(range(103))
    assert batches == sentence_batches(lengths, 10, seed=1, epoch=0) != sentence_batches(lengths, 10, 1, epoch=1)


def test_per_sentence_loss_averages_each_sentence_then_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[4, 5, 3], [6, 0, 0]])  # 3 tokens and 1 token (0 = padding)
    objective, loss_sum, nll_sum = per_sentence_label_smoothed_cross_entropy(logits, target, 0.1, 0)
    per_token = F.cross_entropy(logits.flatten(0, 1), target.flatten(), label_smoothing=0.1,
                                reduction="none").view(2, 3)
    expected = per_token[0].mean() + per_token[1, 0]
    assert torch.allclose(objective, expected) and torch.allclose(loss_sum, per_token[0].sum() + per_token[1, 0])
    nll = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0, reduction="sum")
    assert torch.allclose(nll_sum, nll)
    assert not torch.allclose(objective / 2, loss_sum / 4)  # differs from the per-token mean


def test_cosine_decay_with_warm_restarts_hand_values():
    # lr 1, first period 10 updates, periods doubling, each restart at half the previous peak.
    values = [cosine_restarts_lr(s, 1.0, 10, t_mul=2.0, m_mul=0.5, alpha=0.1) for s in (1, 6, 11, 21, 31)]
    assert values == pytest.approx([1.0, 0.55, 0.55, 0.325, 0.325])
    # The preset's shrinking periods (t_mul 0.9): mid second period, then the floor after 10,000.
    assert cosine_restarts_lr(1501, 0.05, 1000, 0.9, 1.0, 0.1) == pytest.approx(
        0.05 * (0.9 * 0.5 * (1 + math.cos(math.pi * 0.5 / 0.9)) + 0.1))
    assert cosine_restarts_lr(10_002, 0.05, 1000, 0.9, 1.0, 0.1) == pytest.approx(0.005)
    assert cosine_restarts_lr(16, 1.0, 10, t_mul=1.0) == pytest.approx(0.5)  # equal periods


def test_time_budget_schedule_over_the_fraction_of_the_budget():
    rate = [time_budget_lr(s, 100, 1.0, 0.2) for s in (10, 20, 80, 200)]
    assert rate == pytest.approx([0.5, 1.0, 0.5, math.sqrt(0.2)])
    assert time_budget_lr(60, 100, 1.0, 0.2, "cosine") == pytest.approx(0.5)
    assert time_budget_lr(100, 100, 1.0, 0.2, "cosine") == pytest.approx(0.0)
    # A machine twice as fast fits twice the updates into the same curve.
    assert time_budget_lr(40, expected_updates(50, 100.0, 400.0), 1.0, 0.2) == pytest.approx(1.0)
    assert time_budget_lr(40, expected_updates(50, 50.0, 400.0), 1.0, 0.2) == pytest.approx(0.5)
    assert time_budget_lr(80, expected_updates(50, 50.0, 400.0), 1.0, 0.2) == pytest.approx(1.0)
    assert expected_updates(0, 0.0, 400.0) == math.inf and time_budget_lr(1, math.inf, 1.0, 0.2) == 0.0


# ---- a small word-level run with the preset options --------------------------------------------

def _word_corpus(tmp_path):
    rng = random.Random(0)
    pairs = []
    for _ in range(240):
        words = rng.sample(WORDS, rng.randint(2, 6))
        pairs.append((" ".join(words).capitalize() + ".", " ".join(w.upper() for w in words) + " ."))
    for name, part in (("train", pairs[:200]), ("valid", pairs[200:])):
        (tmp_path / f"{name}.src").write_text("\n".join(p[0] for p in part) + "\n")
        (tmp_path / f"{name}.tgt").write_text("\n".join(p[1] for p in part) + "\n")
    vectors = {w: [float(i + 1)] * 16 for i, w in enumerate(WORDS[:8])}
    write_vec(tmp_path / "src.vec", vectors)
    write_vec(tmp_path / "tgt.vec", vectors)


def _raw(tmp_path, **train):
    return {
        "data": {"train_src": str(tmp_path / "train.src"), "train_tgt": str(tmp_path / "train.tgt"),
                 "valid_src": str(tmp_path / "valid.src"), "valid_tgt": str(tmp_path / "valid.tgt")},
        "tokenizer": {"kind": "word", "joint": False, "lowercase": True, "token_filter": "alpha_punct",
                      "require_vectors": True, "src_lang": "de", "tgt_lang": "en"},
        "model": {"d_model": 16, "num_heads": 2, "head_dim": 4, "d_ff": 32, "num_encoder_layers": 1,
                  "num_decoder_layers": 1, "dropout": 0.1, "src_vectors": str(tmp_path / "src.vec"),
                  "tgt_vectors": str(tmp_path / "tgt.vec"), "freeze_embeddings": True, "tie_output": False,
                  "pre_post_norm": True, "time_shared_dropout": True, "scale_embeddings": False},
        "train": {"batch_sentences": 50, "optimizer": "sgd", "momentum": 0.9, "nesterov": True,
                  "schedule": "cosine_restarts", "lr": 0.05, "first_decay_steps": 3, "t_mul": 0.9,
                  "alpha": 0.1, "loss_normalization": "sentences", "label_smoothing": 0.0, "max_epochs": 2,
                  "validate_every_epoch": True, "epoch_checkpoints": True, "valid_every": 1000,
                  "valid_bleu": False, "log_every": 2, "seed": 2, "num_threads": 1, **train},
        "decode": {"beam_size": 2},
    }


@pytest.fixture(scope="module")
def word_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("word")
    _word_corpus(tmp_path)
    training = TrainingRun(config_from_dict(_raw(tmp_path)), tmp_path / "run", progress=False)
    start = training.trainer.model.encoder.embedding.weight.clone()
    training.run()
    records = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    return tmp_path, training, start, records


def test_batch_sentences_in_training(word_run):
    _, training, _, records = word_run
    assert [len(b) for b in sorted(training.epoch_batches(0), key=len)] == [50, 50, 50, 50]
    assert training.progress.step == 8  # 2 epochs of 200 sentences in batches of 50


def test_per_epoch_report_and_checkpoints(word_run):
    tmp_path, _, _, records = word_run
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    for r in epochs:
        assert r["train_ppl"] == pytest.approx(math.exp(r["train_loss"]))  # no label smoothing
        assert r["valid_loss"] > 0 and r["epoch_seconds"] > 0
    assert (tmp_path / "run/checkpoints/epoch_1.safetensors").is_file()
    assert (tmp_path / "run/checkpoints/epoch_2.safetensors").is_file()


def test_sgd_with_nesterov_momentum(word_run):
    _, training, _, _ = word_run
    opt = training.trainer.optimizer
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["nesterov"] and opt.param_groups[0]["momentum"] == 0.9
    assert all("momentum_buffer" in opt.state[p] for p in training.trainer.params if p.requires_grad)


def test_cosine_restarts_drive_the_training_rate(word_run):
    _, _, _, records = word_run
    rates = {r["step"]: r["lr"] for r in records if r["kind"] == "train"}
    for step, lr in rates.items():
        assert lr == pytest.approx(cosine_restarts_lr(step, 0.05, 3, 0.9, 1.0, 0.1))


def test_frozen_vectors_initialise_the_vocabulary_and_stay(word_run):
    tmp_path, training, start, _ = word_run
    tok = training.data.src_tok
    assert sorted(tok.words) == sorted(WORDS[:8])  # only words with a vector; '.' has none
    emb = training.trainer.model.encoder.embedding.weight
    assert torch.equal(emb[tok.stoi["haus"]], torch.full((16,), 1.0))
    assert torch.equal(emb, start)  # frozen through training


def test_per_sentence_loss_in_the_trainer_gradient(word_run):
    tmp_path, training, _, _ = word_run
    corpus = training.data.train
    batch = batch_from_arrays(*corpus.pairs(range(4)))
    training.trainer.model.eval()  # no dropout, so two passes agree
    captured = {}
    step = training.trainer.optimizer.step
    projection = training.trainer.model.decoder.output_projection
    training.trainer.optimizer.step = lambda: captured.update(g=projection.weight.grad.clone())
    try:
        training.trainer.train_step([batch])
    finally:
        training.trainer.optimizer.step = step
        training.trainer.model.train()
    training.trainer.model.eval()
    logits = training.trainer.model(batch.src, batch.tgt_in)
    objective, _, _ = per_sentence_label_smoothed_cross_entropy(logits, batch.tgt_out, 0.0, 0)
    training.trainer.model.zero_grad()
    (objective / 4).backward()
    training.trainer.model.train()
    expected = training.trainer.model.decoder.output_projection.weight.grad
    assert torch.allclose(captured["g"], expected, atol=1e-6)


def test_time_budget_schedule_fits_the_measured_rate(tmp_path):
    _word_corpus(tmp_path)
    raw = _raw(tmp_path, schedule="time_budget", lr=0.05, warmup_fraction=0.5, max_minutes=10, max_epochs=1,
               epoch_checkpoints=False, validate_every_epoch=False)
    for knob in ("first_decay_steps", "t_mul", "alpha"):  # cosine_restarts knobs: refused under time_budget
        del raw["train"][knob]
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    training.run()
    expected = training.progress.expected_steps
    assert 4 < expected < math.inf  # 4 updates took a small part of the 10 minutes
    assert training.trainer.scheduler.get_last_lr()[0] == pytest.approx(time_budget_lr(5, expected, 0.05, 0.5))



def test_training_batches_start_the_decoder_where_search_does(tmp_path):
    """Teacher forcing feeds the decoder the id greedy and beam search start from."""
    _word_corpus(tmp_path)
    raw = _raw(tmp_path)
    raw["model"]["decoder_start_id"] = PAD_ID
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    batches = training._next_update(training.epoch_batches(0))
    assert batches and all(set(b.tgt_in[:, 0].tolist()) == {PAD_ID} for b in batches)
    assert torch.equal(batches[0].tgt_in[:, 1:2], batches[0].tgt_out[:, :1])  # then the target, shifted

# ---- decoding -----------------------------------------------------------------------------------

def test_average_log_probability_score():
    tok = WordTokenizer([f"w{i}" for i in range(36)], "en")
    raw = {"data": {"train_src": "a", "train_tgt": "b"}, "decode": {"length_penalty_type": "average"}}
    model = tiny_model(seed=3)
    translator = Translator(model, tok, tok, config_from_dict(raw))
    for beam in (1, 4):
        for h in translator.translate(["w1 w2 w3", "w4"], beam_size=beam, nbest=min(beam, 2))[0].hypotheses:
            assert h.score == pytest.approx(h.log_prob / len(h.token_ids))
    gnmt = Translator(model, tok, tok, config_from_dict({"data": raw["data"]}))
    h = gnmt.translate(["w1 w2 w3"], beam_size=4)[0].hypotheses[0]
    assert h.score != pytest.approx(h.log_prob / len(h.token_ids))
