"""attnmt plot-positions: the sinusoidal encoding of section 3.5 and a model's learned table,
drawn as real pictures (PNG files whose pixel rows differ), and the table drawn is the model's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from attnmt import cli, rundir
from attnmt.config import Config, ModelConfig
from attnmt.data.tokenizers import Tokenizer
from attnmt.model.positional import sinusoidal_table
from attnmt.model.transformer import Transformer
from attnmt.visualize import positional_tables


def _distinct_rows(path) -> int:
    pixels = imread(str(path))  # (rows, columns, channels) floats
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
    return len(np.unique(pixels.reshape(pixels.shape[0], -1), axis=0))


def _model_dir(tmp_path, positional: str):
    """A model directory with random weights (no training needed to draw its table)."""
    run_dir = tmp_path / positional
    run_dir.mkdir()
    tok = Tokenizer.train(["ein mann sieht einen hund", "a man sees a dog", "zwei hunde spielen"] * 20,
                          vocab_size=30, model_type="bpe")
    mc = ModelConfig(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                     positional=positional, max_positions=40)
    torch.manual_seed(0)
    model = Transformer(mc, len(tok), len(tok))
    rundir.write_config(Config(model=mc), run_dir)
    rundir.write_tokenizers(run_dir, tok, tok)
    rundir.save_weights(model, run_dir / rundir.WEIGHTS)
    return run_dir, model


def test_sinusoidal_plot_is_a_real_picture(tmp_path, capsys):
    out = tmp_path / "sin.png"
    assert cli.main(["-q", "plot-positions", "--d-model", "64", "--max-len", "50", "--output", str(out)]) == 0
    assert _distinct_rows(out) > 100


def test_learned_table_is_the_models_own_and_is_drawn(tmp_path):
    run_dir, model = _model_dir(tmp_path, "learned")
    tables, _ = positional_tables(run_dir, 30)
    assert [name for name, _ in tables] == ["encoder, learned", "decoder, learned"]
    torch.testing.assert_close(tables[0][1], model.encoder.positions.embedding.weight[:30].detach())
    torch.testing.assert_close(tables[1][1], model.decoder.positions.embedding.weight[:30].detach())
    out = tmp_path / "learned.png"
    assert cli.main(["-q", "plot-positions", "--model", str(run_dir), "--max-len", "30", "--output", str(out)]) == 0
    assert _distinct_rows(out) > 100


def test_a_sinusoidal_model_gives_the_papers_table(tmp_path):
    run_dir, _ = _model_dir(tmp_path, "sinusoidal")
    (name, table), = positional_tables(run_dir, 25)[0]
    assert name == "sinusoidal, interleaved layout"
    torch.testing.assert_close(table, sinusoidal_table(25, 16))
    assert table[3, 0] == pytest.approx(np.sin(3.0)) and table[3, 1] == pytest.approx(np.cos(3.0))


def test_bad_requests_are_one_line_errors(tmp_path, capsys):
    run_dir, _ = _model_dir(tmp_path, "learned")
    for argv, words in ((["--model", str(run_dir), "--max-len", "41"], "max_positions 40"),
                        (["--model", str(run_dir), "--layout", "halves"], "--layout"),
                        (["--d-model", "7"], "even")):
        assert cli.main(["plot-positions", *argv, "--output", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err
    assert not (tmp_path / "x.png").exists()
