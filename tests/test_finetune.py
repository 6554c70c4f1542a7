"""Fine-tuning from a model directory (``train.init_from``, ``train.freeze``).

A tiny random MarianMT model is built with transformers (as in test_interop_marian), imported,
and fine-tuned for a few dozen updates on a few hundred Multi30k pairs; a tiny attnmt run is
fine-tuned on its own data from its own weights.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attnmt.cli import main
from attnmt.config import ModelConfig, config_from_dict
from attnmt.data.batching import make_batch
from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.errors import ConfigError
from attnmt.interop.marian import import_marian, vocabulary_order
from attnmt.model.transformer import Transformer
from attnmt.train.finetune import freeze
from attnmt.train.loop import TrainingRun, train
from tests.test_interop_marian import _data_dir, _lines, save_tiny_marian

transformers = pytest.importorskip("transformers")

TRAIN_PAIRS, VALID_PAIRS = 300, 40


def _records(run_dir, kind):
    lines = (run_dir / "train_log.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A directory with train.de/en (300 pairs) and valid.de/en (40 pairs) from Multi30k train."""
    data_dir = _data_dir()
    de, en = _lines(data_dir, "de", TRAIN_PAIRS + VALID_PAIRS), _lines(data_dir, "en", TRAIN_PAIRS + VALID_PAIRS)
    d = tmp_path_factory.mktemp("corpus")
    for name, lines in (("train.de", de[:TRAIN_PAIRS]), ("train.en", en[:TRAIN_PAIRS]),
                        ("valid.de", de[TRAIN_PAIRS:]), ("valid.en", en[TRAIN_PAIRS:])):
        (d / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _data(corpus) -> dict:
    return {"train_src": str(corpus / "train.de"), "train_tgt": str(corpus / "train.en"),
            "valid_src": str(corpus / "valid.de"), "valid_tgt": str(corpus / "valid.en"), "max_len": 60}


@pytest.fixture(scope="module")
def marian(tmp_path_factory, corpus):
    """(the transformers model in eval mode, its MarianMT directory, its attnmt import)."""
    source, target = _lines(_data_dir(), "de", 400), _lines(_data_dir(), "en", 400)
    hf_dir = tmp_path_factory.mktemp("marian")
    model = save_tiny_marian(hf_dir, source, target, logits_bias_std=0.0)  # EOS alone biased: outputs end
    imported = import_marian(str(hf_dir), tmp_path_factory.mktemp("imported") / "model")
    return model.eval(), hf_dir, imported


FREEZE = ["embeddings", "decoder.layers.0.*"]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, corpus, marian):
    """The imported model fine-tuned for 40 updates with its embeddings (and the tied output
    layer) and the first decoder layer frozen, through the command line."""
    _, _, imported = marian
    cfg = {"data": _data(corpus),
           "train": {"max_steps": 40, "batch_tokens": 500, "schedule": "inverse_sqrt", "lr": 0.01,
                     "warmup_steps": 5, "valid_every": 20, "log_every": 5, "device": "cpu", "num_threads": 1,
                     "freeze": FREEZE}}
    path = tmp_path_factory.mktemp("cfg") / "finetune.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    out = tmp_path_factory.mktemp("runs") / "finetuned"
    assert main(["-q", "train", str(path), "--output", str(out), "--set", f"train.init_from={imported}"]) == 0
    return out


def test_tokenizers_copied_byte_for_byte_and_start_recorded(marian, finetuned):
    _, _, imported = marian
    for name in ("src.spm.model", "tgt.spm.model", "vocab.json"):
        assert (finetuned / name).read_bytes() == (imported / name).read_bytes()
    start = json.loads((finetuned / "init_from.json").read_text())
    assert start["sha256"] == hashlib.sha256((imported / "model.safetensors").read_bytes()).hexdigest()
    assert _records(finetuned, "init_from")[0]["sha256"] == start["sha256"]
    saved = yaml.safe_load((finetuned / "config.yaml").read_text())
    imported_cfg = yaml.safe_load((imported / "config.yaml").read_text())
    assert saved["model"] == imported_cfg["model"] and saved["decode"] == imported_cfg["decode"]
    assert saved["model"]["decoder_start_id"] == PAD_ID and saved["model"]["forbidden_ids"] == [PAD_ID]


def test_loss_falls_from_the_step_0_validation(finetuned):
    valid, losses = _records(finetuned, "valid"), [r["loss"] for r in _records(finetuned, "train")]
    assert valid[0]["step"] == 0 and valid[0]["valid_bleu"] is not None
    assert [r["step"] for r in valid] == [0, 20, 40]
    assert losses[-1] < losses[0] - 0.5, losses
    assert valid[-1]["valid_loss"] < valid[0]["valid_loss"] - 0.5


def test_frozen_parameters_bit_identical_others_changed(marian, finetuned):
    _, _, imported = marian
    before = load_file(str(imported / "model.safetensors"))
    after = torch.load(finetuned / "checkpoints" / "last.pt", weights_only=True)["model"]  # the final weights
    probe = Transformer(config_from_dict(yaml.safe_load((imported / "config.yaml").read_text())).model, 8, 8)
    assert "encoder.embedding.weight" in freeze(probe, FREEZE)
    frozen = {name for name, p in probe.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert {"decoder.embedding.weight", "decoder.output_projection.weight",
            "decoder.layers.0.src_attn.q_proj.weight"} <= frozen
    assert "decoder.output_projection.bias" not in frozen and "decoder.layers.1.src_attn.q_proj.weight" not in frozen
    assert len(before) == len(list(probe.parameters()))  # every tensor compared
    for name in before:
        same = torch.equal(before[name], after[name])
        assert same == (name in frozen), name
    # the tied output projection is the frozen embedding; its bias (a decoder parameter) trained
    assert torch.equal(after["decoder.output_projection.weight"], before["decoder.embedding.weight"])


def test_finetuned_exports_to_ctranslate2_and_translates(corpus, finetuned, tmp_path, capsys):
    """The fine-tuned directory exports to CTranslate2, whose teacher-forced log-probabilities of
    validation pairs equal attnmt's (same weights, decoder start and vocabulary), and translates
    through ``attnmt translate --engine ctranslate2`` (one line out per line in)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from attnmt.decode.translator import Translator

    src = (corpus / "valid.de").read_text(encoding="utf-8").splitlines()[:10]
    tgt = (corpus / "valid.en").read_text(encoding="utf-8").splitlines()[:10]
    assert main(["-q", "export", "ctranslate2", "--model", str(finetuned), "--output", str(tmp_path / "ct2")]) == 0
    native = Translator.from_dir(finetuned)
    expected = [r.log_prob for r in native.score(src, tgt)]
    pieces = native.src_tokenizer.pieces, native.tgt_tokenizer.pieces
    got = ctranslate2.Translator(str(tmp_path / "ct2")).score_batch(
        [pieces[0](ids) for ids in native.src_tokenizer.encode_batch(src)],
        [pieces[1](ids) for ids in native.tgt_tokenizer.encode_batch(tgt)])
    assert [sum(r.log_probs) for r in got] == pytest.approx(expected, abs=1e-3)
    (tmp_path / "in.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["-q", "translate", "--engine", "ctranslate2", "--model", str(tmp_path / "ct2"), "--input",
                 str(tmp_path / "in.txt"), "--beam-size", "2", "--early-stopping", "true"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 11 and lines[-1] == "" and all(lines[:10])


def test_training_batches_follow_marian_conventions(marian, corpus, tmp_path):
    """The trainer's teacher-forced batches start from MarianMT's decoder start (its pad token)
    and its NLL per token equals transformers' loss for the same pairs (labels + EOS)."""
    hf_model, hf_dir, imported = marian
    config = config_from_dict({"data": _data(corpus), "train": {"init_from": str(imported), "device": "cpu",
                                                                "label_smoothing": 0.0}})
    training = TrainingRun(config, tmp_path / "run")
    training.trainer.model.eval()
    src, tgt = training.data.valid_sets[0].pairs.src[:6], training.data.valid_sets[0].pairs.tgt[:6]
    batch = make_batch(src, tgt, training.config.model.decoder_start_id)
    assert (batch.tgt_in[:, 0] == PAD_ID).all()
    with torch.no_grad():
        _, nll = training.trainer.batch_loss(batch)
    order = torch.tensor(vocabulary_order(json.loads((hf_dir / "vocab.json").read_text()),
                                          hf_model.config.vocab_size, hf_model.config.pad_token_id, 0)[0])
    hf_src = order[batch.src].masked_fill(batch.src == PAD_ID, hf_model.config.pad_token_id)
    labels = order[batch.tgt_out].masked_fill(batch.tgt_out == PAD_ID, -100)
    with torch.no_grad():
        expected = hf_model(input_ids=hf_src, attention_mask=(batch.src != PAD_ID).long(), labels=labels).loss
    assert nll.item() / batch.num_tgt_tokens == pytest.approx(expected.item(), abs=1e-4)
    assert (batch.tgt_out == EOS_ID).sum() == len(tgt)


def test_finetuning_own_run_starts_at_its_validation_loss(corpus, tmp_path):
    """A tiny attnmt run, then a fine-tuning run on the same data from its weights: the step-0
    validation loss is the run's validation loss at those weights."""
    base = {"data": _data(corpus), "tokenizer": {"vocab_size": 120},
            "model": {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1,
                      "max_positions": 128},
            "train": {"max_steps": 20, "batch_tokens": 600, "valid_every": 10, "log_every": 10, "device": "cpu",
                      "warmup_steps": 10, "num_threads": 1, "lr_factor": 2.0}}
    train(config_from_dict(base), tmp_path / "general", progress=False)
    best = [r for r in _records(tmp_path / "general", "valid") if r["best"]][-1]
    tuned = {"data": _data(corpus), "train": {**base["train"], "max_steps": 1, "init_from": str(tmp_path / "general")}}
    train(config_from_dict(tuned), tmp_path / "tuned", progress=False)
    start = _records(tmp_path / "tuned", "valid")[0]
    assert start["step"] == 0 and start["valid_bleu"] is not None
    assert start["valid_loss"] == pytest.approx(best["valid_loss"], abs=1e-4)
    assert (tmp_path / "tuned" / "spm.model").read_bytes() == (tmp_path / "general" / "spm.model").read_bytes()
    tuned["train"].update(max_steps=2, valid_every=1)  # resumed: no second start, no second step 0
    train(config_from_dict(tuned), tmp_path / "tuned", resume=True, progress=False)
    assert [r["step"] for r in _records(tmp_path / "tuned", "valid")] == [0, 1, 2]
    assert len(_records(tmp_path / "tuned", "init_from")) == 1


def test_freeze_groups_and_patterns():
    """'embeddings' is the token embeddings with what is tied to them (not learned positions);
    'encoder'/'decoder' the rest of each side; patterns match names; none matching is an error."""
    def frozen(patterns, **options):
        cfg = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2, **options)
        model = Transformer(ModelConfig(**cfg), 20, 20)
        freeze(model, patterns)
        return {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    assert frozen(["embeddings"]) == {"encoder.embedding.weight", "decoder.embedding.weight",
                                      "decoder.output_projection.weight"}
    learned = frozen(["embeddings"], positional="learned", tie_output=False)
    assert learned == {"encoder.embedding.weight", "decoder.embedding.weight"}
    encoder = frozen(["encoder"], positional="learned")
    assert "encoder.positions.embedding.weight" in encoder and "encoder.embedding.weight" not in encoder
    assert all(n.startswith("encoder.") for n in encoder) and len(encoder) > 10
    assert frozen(["*.norm.bias"]) == {f"{side}.layers.{i}.sublayers.{j}.norm.bias" for side, n in
                                       (("encoder", 2), ("decoder", 3)) for i in range(2) for j in range(n)}
    with pytest.raises(ConfigError, match="'decoder.layers.7.*' matches no parameter"):
        frozen(["decoder", "decoder.layers.7.*"])


def test_prepared_data_for_finetuning_uses_the_models_tokenizers(corpus, marian, tmp_path, capsys):
    """``attnmt prepare`` of a fine-tuning configuration encodes with the starting model's
    tokenizers (no new ones trained); training from that directory works, and from a directory
    prepared with other tokenizers is refused in one line."""
    _, _, imported = marian
    train = {"max_steps": 2, "batch_tokens": 500, "valid_every": 2, "valid_bleu": False, "device": "cpu"}
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump({"data": _data(corpus), "train": {**train, "init_from": str(imported)}}))
    assert main(["-q", "prepare", str(path), "--output", str(tmp_path / "prepared"), "--workers", "1"]) == 0
    for name in ("src.spm.model", "tgt.spm.model", "vocab.json"):
        assert (tmp_path / "prepared" / name).read_bytes() == (imported / name).read_bytes()
    prepared = ["--set", "data.train_src=null", "--set", "data.train_tgt=null", "--set", "data.valid_src=null",
                "--set", "data.valid_tgt=null"]
    assert main(["-q", "train", str(path), "--output", str(tmp_path / "run"), *prepared,
                 "--set", f"data.prepared={tmp_path / 'prepared'}"]) == 0
    assert (tmp_path / "run" / "vocab.json").read_bytes() == (imported / "vocab.json").read_bytes()
    assert [r["step"] for r in _records(tmp_path / "run", "valid")] == [0, 2]
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"data": _data(corpus), "tokenizer": {"vocab_size": 100}, "train": train}))
    assert main(["-q", "prepare", str(other), "--output", str(tmp_path / "own"), "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["-q", "train", str(path), "--output", str(tmp_path / "run2"), *prepared,
                 "--set", f"data.prepared={tmp_path / 'own'}"]) == 2
    err = capsys.readouterr().err
    assert "other tokenizers" in err and err.count("\n") == 1


def test_contradicting_model_keys_and_unknown_freeze_patterns_refused(corpus, marian, tmp_path, capsys):
    _, _, imported = marian
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"data": _data(corpus), "model": {"d_model": 32, "num_heads": 2,
                                                                     "dropout": 0.3}}), encoding="utf-8")
    common = ["train", str(path), "--set", f"train.init_from={imported}", "--set", "train.device=cpu"]
    assert main([*common, "--output", str(tmp_path / "a"), "--set", "model.d_ff=128"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmt: error:") and err.count("\n") == 1
    assert "model.num_heads" in err and "model.d_ff" in err
    assert "model.d_model" not in err and "dropout" not in err  # equal, and a training-only key
    assert not (tmp_path / "a").exists()
    path.write_text(yaml.safe_dump({"data": _data(corpus)}), encoding="utf-8")
    assert main([*common, "--output", str(tmp_path / "b"), "--set", "train.freeze=[encoder, nothing.*]"]) == 2
    err = capsys.readouterr().err
    assert "'nothing.*' matches no parameter" in err and err.count("\n") == 1
    with pytest.raises(ConfigError, match="tokenizer.vocab_size"):
        TrainingRun(config_from_dict({"data": _data(corpus), "tokenizer": {"vocab_size": 500},
                                  "train": {"init_from": str(imported)}}), tmp_path / "c")
