"""Train a small model on a copy task (about a minute on 2 cores), then use it as a user would:
the run directory, translation through Python and the CLI, resume, and one-line CLI errors."""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys

import pytest
import torch

from attnmt import precision
from attnmt.config import config_from_dict
from attnmt.data.batching import batch_from_arrays
from attnmt.decode.translator import Translator
from attnmt.train.loop import TrainingRun, train

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa"]


def _sentences(rng, n):
    # Distinct words in a sentence, so that each output word has one source counterpart.
    return [" ".join(rng.sample(WORDS, rng.randint(2, 7))) for _ in range(n)]


def _config(tmp_path, max_steps):
    rng = random.Random(0)
    train_lines, valid_lines = _sentences(rng, 3000), _sentences(rng, 60)
    for name, lines in (("train", train_lines), ("valid", valid_lines)):
        for side in ("src", "tgt"):
            (tmp_path / f"{name}.{side}").write_text("\n".join(lines) + "\n")
    return {
        "data": {"train_src": str(tmp_path / "train.src"), "train_tgt": str(tmp_path / "train.tgt"),
                 "valid_src": str(tmp_path / "valid.src"), "valid_tgt": str(tmp_path / "valid.tgt")},
        "tokenizer": {"vocab_size": 120, "model_type": "bpe"},
        "model": {"d_model": 64, "num_heads": 4, "d_ff": 128, "num_encoder_layers": 2, "num_decoder_layers": 2,
                  "dropout": 0.0, "share_embeddings": True},
        "train": {"batch_tokens": 1500, "schedule": "inverse_sqrt", "lr": 3e-3, "warmup_steps": 50,
                  "max_steps": max_steps, "valid_every": 150, "log_every": 25, "precision": "bf16",
                  "label_smoothing": 0.1, "seed": 3},
        "decode": {"beam_size": 4},
    }


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("copy")
    raw = _config(tmp_path, max_steps=150)
    run_dir = tmp_path / "run"
    train(config_from_dict(raw), run_dir, progress=False)
    first_state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    raw["train"]["max_steps"] = 450
    result = train(config_from_dict(raw), run_dir, resume=True, progress=False)
    return run_dir, result, first_state


def test_run_directory_is_self_contained(copy_run):
    run_dir, result, first_state = copy_run
    for name in ("config.yaml", "spm.model", "model.safetensors", "checkpoints/last.pt", "train_log.jsonl"):
        assert (run_dir / name).is_file(), name
    assert first_state["progress"]["step"] == 150
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["progress"]["step"] == 450 and result.steps == 450


def test_training_loss_falls_and_resume_continues(copy_run):
    run_dir, _, _ = copy_run
    records = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == sorted(train_steps) and len(set(train_steps)) == len(train_steps)  # no step twice
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert losses[-1] < 0.35 * losses[0]
    valid = [r for r in records if r["kind"] == "valid"]
    assert valid[-1]["valid_bleu"] > 90


def test_copy_task_translated_exactly(copy_run):
    run_dir, _, _ = copy_run
    tr = Translator.from_dir(run_dir)
    held_out = _sentences(random.Random(99), 20)
    for beam in (1, 4):
        out = [t.text for t in tr.translate(held_out, beam_size=beam)]
        exact = sum(o == s for o, s in zip(out, held_out))
        assert exact >= 18, (beam, [(o, s) for o, s in zip(out, held_out) if o != s])  # 90% copied exactly


def test_attention_option_switches_the_kernel_not_the_output(copy_run):
    # decode.attention (and Translator.set_attention) picks the kernel of every attention module;
    # the fused kernel and the explicit formula give the same translations.
    from attnmt.model.attention import MultiHeadAttention

    run_dir, _, _ = copy_run
    tr = Translator.from_dir(run_dir)
    assert tr.config.decode.attention == "explicit"
    held_out = _sentences(random.Random(7), 6)
    outputs = []
    for kind in ("explicit", "fused"):
        tr.set_attention(kind)
        assert {m.fused for m in tr.model.modules() if isinstance(m, MultiHeadAttention)} == {kind == "fused"}
        outputs.append([t.text for t in tr.translate(held_out, beam_size=4)])
    assert outputs[0] == outputs[1] and sum(o == s for o, s in zip(outputs[0], held_out)) >= 5


def test_bf16_runs_only_where_the_cpu_has_fast_kernels(copy_run, monkeypatch, caplog):
    """A bf16 request trains and translates in bfloat16 on a CPU with bfloat16 kernels, and in
    float32 (with one warning) elsewhere: checked on the dtypes the model computes in."""
    from attnmt.precision import autocast

    run_dir, _, _ = copy_run
    config = config_from_dict(_config(run_dir.parent, max_steps=1))
    tr = Translator.from_dir(run_dir)
    for fast, expected, name in ((True, torch.bfloat16, "bf16"), (False, torch.float32, "fp32")):
        monkeypatch.setattr(precision, "cpu_bf16_is_fast", lambda fast=fast: fast)
        monkeypatch.setattr(precision, "_warned", set())
        with caplog.at_level(logging.WARNING, logger="attnmt.precision"):
            training = TrainingRun(config, run_dir.parent / f"bf16-{fast}", progress=False)
            tr.set_precision("fp32")
            tr.set_precision("bf16")
        assert any("no fast bfloat16" in r.message for r in caplog.records) == (not fast)
        caplog.clear()
        seen = []
        hook = training.trainer.model.decoder.layers[0].feed_forward.w_1.register_forward_hook(
            lambda module, inputs, output: seen.append(output.dtype))
        batch = batch_from_arrays(*training.data.train.pairs([0]))
        with autocast(training.trainer.precision):
            training.trainer.batch_loss(batch)
        hook.remove()
        assert seen == [expected]
        assert next(tr.model.parameters()).dtype == expected and tr.precision == name
    assert precision.effective_precision("int8") == "int8"


def _cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "attnmt", "-q", *args], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_cli_translate_keeps_lines(copy_run, tmp_path):
    run_dir, _, _ = copy_run
    proc = _cli("translate", "--model", str(run_dir), "--beam-size", "3", stdin="alpha bravo\n\nkilo lima mike\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "alpha bravo\n\nkilo lima mike\n"


def test_cli_errors_are_one_line(copy_run, tmp_path):
    run_dir, _, _ = copy_run
    (tmp_path / "s").write_text("a\nb\n")
    (tmp_path / "r").write_text("a\n")
    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("data: {dataset: multi30k, pair: de-en}\nmodel: {heads: 3}\n")
    cases = [
        ("evaluate", "--model", str(run_dir), "--src", str(tmp_path / "s"), "--ref", str(tmp_path / "r")),
        ("translate", "--model", str(tmp_path / "missing")),
        ("train", str(bad_cfg), "--output", str(tmp_path / "out")),
        ("train", str(tmp_path / "nope.yaml"), "--output", str(tmp_path / "out")),
        ("translate", "--model", str(run_dir), "--input", str(tmp_path / "nope.txt")),
    ]
    for args in cases:
        proc = _cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnmt: error:"), (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_training_into_an_existing_run_is_refused(copy_run):
    run_dir, _, _ = copy_run
    proc = _cli("train", str(run_dir / "config.yaml"), "--output", str(run_dir))
    assert proc.returncode == 2 and "--resume" in proc.stderr


# --- looking inside the model (attention, token probabilities, forced decoding) ---------------


def test_copy_model_attention_is_diagonal(copy_run):
    """Copying aligns output subword t with source subword t; some attention map of the trained
    model (a head, or a layer's head average) must show that alignment for >= 90% of tokens."""
    run_dir, _, _ = copy_run
    tr = Translator.from_dir(run_dir)
    sentences = _sentences(random.Random(5), 10)
    results = [r for r in tr.translate(sentences, beam_size=4, return_attention=True)
               if r.hypotheses[0].pieces == r.src_pieces]
    assert len(results) >= 8
    layers, heads = results[0].attention.shape[:2]
    assert all(r.attention.shape == (layers, heads, len(r.src_pieces), len(r.src_pieces)) for r in results)
    fractions = {}
    for layer in range(layers):
        for head in list(range(heads)) + ["avg"]:
            hits = total = 0
            for r in results:
                w = r.attention[layer].mean(dim=0) if head == "avg" else r.attention[layer, head]  # (T, S)
                hits += int((w.argmax(dim=-1) == torch.arange(w.size(0))).sum())
                total += w.size(0)
            fractions[(layer + 1, head)] = hits / total
    assert max(fractions.values()) >= 0.9, fractions


def test_token_probabilities_sum_to_the_score(copy_run):
    run_dir, _, _ = copy_run
    proc = _cli("translate", "--model", str(run_dir), "--beam-size", "4", "--nbest", "3", "--scores",
                "--format", "jsonl", stdin="alpha bravo charlie\nkilo\n")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["id"] for r in rows] == [0, 1] and all(len(r["hypotheses"]) == 3 for r in rows)
    for r in rows:
        scores = [h["score"] for h in r["hypotheses"]]
        assert scores == sorted(scores, reverse=True)
        for h in r["hypotheses"]:
            assert h["tokens"][-1] == "</s>" and len(h["tokens"]) == len(h["token_probs"])
            log_prob = sum(math.log(p) for p in h["token_probs"])
            assert log_prob == pytest.approx(h["log_prob"], abs=1e-4)
            lp = ((5 + len(h["tokens"])) / 6) ** 0.6
            assert h["score"] == pytest.approx(h["log_prob"] / lp, abs=1e-4)
    text = _cli("translate", "--model", str(run_dir), "--scores", stdin="alpha bravo\n")
    fields = text.stdout.strip().split(" ||| ")
    assert fields[0] == "0" and fields[1] == "alpha bravo" and len(fields) == 5
    probs = [float(tok.rsplit("=", 1)[1]) for tok in fields[4].split()]
    assert sum(math.log(p) for p in probs) == pytest.approx(float(fields[3]), abs=1e-4)


def test_forced_decoding_reproduces_the_search_log_prob(copy_run, tmp_path):
    run_dir, _, _ = copy_run
    tr = Translator.from_dir(run_dir)
    sources = _sentences(random.Random(7), 8)
    found = tr.translate(sources, beam_size=1)
    scored = tr.score(sources, [t.text for t in found])
    for f, s in zip(found, scored):
        assert s.token_ids == f.hypotheses[0].token_ids
        assert s.log_prob == pytest.approx(f.hypotheses[0].log_prob, abs=1e-4)
    (tmp_path / "src").write_text("\n".join(sources) + "\n")
    (tmp_path / "tgt").write_text("\n".join(t.text for t in found) + "\n")
    proc = _cli("score", "--model", str(run_dir), "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(sources) + 1 and lines[-1].startswith("corpus\t")
    for line, f in zip(lines, found):
        assert float(line.split("\t")[1]) == pytest.approx(f.hypotheses[0].log_prob, abs=1e-4)
    total_lp = sum(f.hypotheses[0].log_prob for f in found)
    total_tokens = sum(len(f.hypotheses[0].token_ids) for f in found)
    assert float(lines[-1].split("\t")[3]) == pytest.approx(math.exp(-total_lp / total_tokens), rel=1e-3)


def test_plots_are_written(copy_run, tmp_path):
    run_dir, _, _ = copy_run
    for extra in ([], ["--self-attention", "encoder"], ["--self-attention", "decoder"]):
        out = tmp_path / f"att{len(extra)}{extra[-1] if extra else ''}.png"
        proc = _cli("plot-attention", "--model", str(run_dir), "alpha bravo charlie", "--output", str(out), *extra)
        assert proc.returncode == 0, proc.stderr
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = _cli("plot-attention", "--model", str(run_dir), "alpha", "--output", str(tmp_path / "x.png"), "--layer", "9")
    assert proc.returncode == 2 and "--layer" in proc.stderr
    proc = _cli("plot-training", str(run_dir), "--output", str(tmp_path / "curves.png"))
    assert proc.returncode == 0 and (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def straight_and_resumed(raw: dict, tmp_path, stop: int) -> tuple[dict, dict]:
    """The last checkpoints of ``raw`` trained to its ``train.max_steps`` in one go
    (``tmp_path/straight``) and stopped after ``stop`` updates, then resumed to the end
    (``tmp_path/resumed``)."""
    total = raw["train"]["max_steps"]
    train(config_from_dict(raw), tmp_path / "straight", progress=False)
    raw["train"]["max_steps"] = stop
    train(config_from_dict(raw), tmp_path / "resumed", progress=False)
    raw["train"]["max_steps"] = total
    train(config_from_dict(raw), tmp_path / "resumed", resume=True, progress=False)
    return tuple(torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)
                 for name in ("straight", "resumed"))


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    """Stopping after 30 updates and resuming to 60 gives bit-identical weights, optimizer state
    and learning rate to 60 updates in one go (data order, schedule and random state restored)."""
    raw = _config(tmp_path, max_steps=60)
    raw["train"].update(precision="fp32", batch_tokens=600, valid_bleu=False)
    raw["model"].update(dropout=0.1)  # the random state matters
    a, b = straight_and_resumed(raw, tmp_path, 30)
    assert a["progress"]["step"] == b["progress"]["step"] == 60
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]
    exp_avg = [s["exp_avg"] for s in a["optimizer"]["state"].values()]
    assert all(torch.equal(x, s["exp_avg"]) for x, s in zip(exp_avg, b["optimizer"]["state"].values()))


def test_chunked_loss_switch_keeps_loss_and_gradients(tmp_path, monkeypatch):
    """The trainer's CHUNKED_LOSS switch (memory) against the plain loss on the logits: the same
    loss and the same gradients, on a real batch of the copy task, also with an output bias."""
    from attnmt.train import trainer as trainer_module

    raw = _config(tmp_path, max_steps=1)
    raw["train"]["precision"] = "fp32"
    raw["model"]["tie_output"] = False
    training = TrainingRun(config_from_dict(raw), tmp_path / "run", progress=False)
    projection = training.trainer.model.decoder.output_projection
    projection.bias = torch.nn.Parameter(torch.randn(projection.out_features))
    idx = list(range(40))
    batch = batch_from_arrays(*training.data.train.pairs(idx))
    results = []
    for chunked in (False, True):
        monkeypatch.setattr(trainer_module, "CHUNKED_LOSS", chunked)
        training.trainer.model.zero_grad()
        loss, nll = training.trainer.batch_loss(batch)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in training.trainer.model.named_parameters()}
        results.append((loss.item(), nll.item(), grads))
    (plain_loss, plain_nll, plain_grads), (loss, nll, grads) = results
    assert loss == pytest.approx(plain_loss, rel=1e-5) and nll == pytest.approx(plain_nll, rel=1e-5)
    for name, grad in plain_grads.items():
        assert torch.allclose(grads[name], grad, atol=1e-5, rtol=1e-3), name
