"""The commands that draw: ``plot-attention`` (attention heatmaps of translations),
``plot-positions`` (positional encodings) and ``plot-training`` (a run's curves);
``attnmt.visualize``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from attnmt import ranges
from attnmt.cli.options import (add_decoding_options, check_output_dir, check_output_file, in_range, positive_int,
                                range_help, read_input)
from attnmt.cli.translators import native_translator
from attnmt.config import DEFAULT_ATTENTION_LAYER
from attnmt.errors import AttnmtError
from attnmt.names import canonical_name

log = logging.getLogger("attnmt")

# the title of each kind of attention (--self-attention, else the encoder-decoder attention)
ATTENTION_TITLES = {"source": "encoder-decoder attention", "encoder": "encoder self-attention",
                    "decoder": "decoder self-attention"}


def cmd_plot_attention(args: argparse.Namespace) -> int:
    from attnmt.rundir import read_config
    from attnmt.visualize import plot_attention

    if (args.sentence is None) == (args.input is None):
        raise AttnmtError("give either a SENTENCE or --input FILE")
    if args.input is not None:
        check_output_dir(args.output, "--output")
    else:
        check_output_file(args.output, "--output")
    sentences = [args.sentence] if args.sentence is not None else [s for s in read_input(args.input) if s.strip()]
    model = read_config(args.model).model  # the layers the model has, before it is loaded
    num_layers = model.num_encoder_layers if args.self_attention == "encoder" else model.num_decoder_layers
    layer = args.layer if args.layer is not None else min(DEFAULT_ATTENTION_LAYER, num_layers)
    if not 1 <= layer <= num_layers:
        raise AttnmtError(f"--layer must be between 1 and {num_layers}")
    tr = native_translator(args)
    output = Path(args.output)
    results = tr.translate(sentences, beam_size=args.beam_size, batch_size=args.batch_size, tgt_lang=args.tgt_lang)
    if args.input is not None:  # after every check of the input: a refused command makes no folder
        output.mkdir(parents=True, exist_ok=True)
    kind = args.self_attention or "source"
    title = ATTENTION_TITLES[kind]
    sources = tr.encode_sources(sentences, args.tgt_lang)
    for n, (sentence, src_ids, result) in enumerate(zip(sentences, sources, results), start=1):
        hyp = result.hypotheses[0]
        weights = tr.attention(src_ids, hyp.token_ids)[kind][layer - 1]  # (H, rows, columns)
        # (column labels, row labels, column axis name, row axis name) of each kind of attention
        x_labels, y_labels, x_name, y_name = {
            "source": (result.src_pieces, hyp.pieces, "source", "output"),
            "encoder": (result.src_pieces, result.src_pieces, "source", "source"),
            "decoder": (["<s>"] + hyp.pieces[:-1], hyp.pieces, "output prefix", "output"),
        }[kind]
        path = output / f"attention_{n:03d}.png" if args.input is not None else output
        plot_attention(weights, x_labels, y_labels, path,
                       f"{sentence}\n-> {hyp.text}\n{title}, layer {layer} of {num_layers}",
                       x_name=x_name, y_name=y_name)
        log.info("wrote %s", path)
    return 0


def cmd_plot_positions(args: argparse.Namespace) -> int:
    from attnmt.model.positional import sinusoidal_table
    from attnmt.visualize import plot_positions, positional_tables

    check_output_file(args.output, "--output")
    if args.model is not None:
        if args.layout is not None:
            raise AttnmtError("--layout applies without --model only (a model's layout is its own)")
        tables, title = positional_tables(args.model, args.max_len)
    else:
        args.layout = args.layout or "interleaved"
        if args.d_model % 2:
            raise AttnmtError(f"--d-model must be even (sines and cosines in pairs), not {args.d_model}")
        tables = [(f"sinusoidal, {args.layout} layout", sinusoidal_table(args.max_len, args.d_model, args.layout))]
        title = f"sinusoidal positional encoding, d_model {args.d_model}"
    plot_positions(tables, args.output, title)
    log.info("wrote %s", args.output)
    return 0


def cmd_plot_training(args: argparse.Namespace) -> int:
    from attnmt.visualize import plot_training

    run_dir = Path(args.run_dir)
    if not (run_dir / "train_log.jsonl").is_file():
        raise AttnmtError(f"{run_dir / 'train_log.jsonl'}: no such file; is {run_dir} a run directory?")
    output = args.output or str(run_dir / "training.png")
    check_output_file(output, "--output")
    plot_training(run_dir, output)
    log.info("wrote %s", output)
    return 0


def add_plot_attention_parser(sub) -> None:
    p = sub.add_parser("plot-attention", help="draw attention heatmaps of translations")
    add_decoding_options(p)
    p.add_argument("sentence", nargs="?", help="a source sentence")
    p.add_argument("--input", help="a file of source sentences (then --output is a folder)")
    p.add_argument("--output", required=True, help="PNG file, or folder with --input")
    p.add_argument("--layer", type=positive_int,
                   help=f"layer, 1 to the model's layers (default {DEFAULT_ATTENTION_LAYER})")
    p.add_argument("--self-attention", type=canonical_name, choices=["encoder", "decoder"], help="draw self-attention instead")
    p.set_defaults(func=cmd_plot_attention)


def add_plot_positions_parser(sub) -> None:
    p = sub.add_parser("plot-positions", help="draw positional encodings: the sinusoids of section 3.5 as a "
                       "heatmap and curves, or a model's (learned) tables")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--model", help="a model directory: its positional encodings (learned: its trained tables)")
    source.add_argument("--d-model", type=in_range(ranges.WIDTH), default=512,
                        help=f"without --model: the sinusoids for this d_model {range_help(ranges.WIDTH)} "
                        "(default 512)")
    p.add_argument("--layout", type=canonical_name, choices=["interleaved", "halves"],
                   help="without --model: sines and cosines interleaved (the paper; default) or in halves")
    p.add_argument("--max-len", type=in_range(ranges.POSITIONS), default=100,
                   help=f"positions drawn {range_help(ranges.POSITIONS)} (default 100)")
    p.add_argument("--output", required=True, help="PNG file")
    p.set_defaults(func=cmd_plot_positions)


def add_plot_training_parser(sub) -> None:
    p = sub.add_parser("plot-training", help="draw a run's training curves")
    p.add_argument("run_dir", help="run directory (with train_log.jsonl)")
    p.add_argument("--output", help="PNG file (default RUN_DIR/training.png)")
    p.set_defaults(func=cmd_plot_training)
