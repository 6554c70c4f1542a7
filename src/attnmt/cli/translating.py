"""The commands that run a model on text: ``translate`` (plain, Moses n-best or JSON lines),
``score`` (forced decoding: log-probability and perplexity of given translations) and
``evaluate`` (BLEU and chrF on a test set, sacreBLEU).
"""

from __future__ import annotations

import argparse
import logging
import time

from attnmt.cli.options import (add_decoding_options, add_engine_options, add_stopping_options, add_testset_options,
                                check_input_file, check_output_file, check_stdout, positive_int, read_input,
                                write_output)
from attnmt.cli.documents import (add_document_options, check_document_options, input_format,
                                  is_document, translate_document)
from attnmt.cli.translators import engine_translator, with_stopping_options
from attnmt.config import DEFAULT_ALIGNMENT_LAYER
from attnmt.errors import AttnmtError
from attnmt.names import canonical_name
from attnmt.oneline import json_line

log = logging.getLogger("attnmt")


def _testset_paths(args: argparse.Namespace):
    """(source, reference) files of ``--testset`` in the model's direction (``--src-lang`` and
    ``--tgt-lang`` where the model has several languages; ``attnmt.data.testsets``), or None
    without ``--testset``."""
    if args.testset is None:
        if args.src_lang is not None and not getattr(args, "document", False):
            raise AttnmtError("--src-lang picks the source side of --testset: give --testset")
        return None
    from attnmt.data.testsets import direction, parse_testset, resolve_testset
    from attnmt.languages import served_languages
    from attnmt.rundir import model_languages, read_config

    parse_testset(args.testset)  # a misspelt set: refused before the model is read
    sources, targets = served_languages(read_config(args.model))
    own_src, own_tgt = model_languages(args.model)  # an imported OPUS-MT model: the pair its name carries
    if not sources and own_src:
        sources = [own_src]
    if not targets and own_tgt:
        targets = [own_tgt]
    src_lang, tgt_lang = direction(sources, targets, args.src_lang, args.tgt_lang)
    return resolve_testset(args.testset, src_lang, tgt_lang, args.data_dir)


def _read_constraints(path: str, count: int, tr) -> list[list[str]]:
    """``--constraints``: one line per input line, the phrases separated by tabs (empty: none),
    each one the translator ``tr`` can spell (``Translator.check_constraints``).

    Raises:
        DataError: an unreadable file. AttnmtError: a line count other than ``count``, or a
            phrase with no target token or an unknown one (FILE:LINE).
    """
    from attnmt.data.text import read_lines
    from attnmt.decode.translator import ConstraintError

    lines = read_lines(path)
    if len(lines) != count:
        raise AttnmtError(f"{path}: {len(lines)} lines of constraints for {count} input lines "
                          "(one line of tab-separated phrases per input line; an empty line for none)")
    constraints = [[p.strip() for p in line.split("\t") if p.strip()] for line in lines]
    try:
        tr.check_constraints(constraints)
    except ConstraintError as e:
        raise AttnmtError(f"{path}:{e.line}: constraint {e.phrase!r} {e.reason}") from None
    return constraints


def cmd_translate(args: argparse.Namespace) -> int:
    from attnmt.decode.output import format_translations

    check_output_file(args.output, "--output")
    if args.testset is not None and args.input is not None:
        raise AttnmtError("give --testset or --input, not both")
    args.document = is_document(args, input_format(args, args.input))  # --src-lang: the splitter's language
    testset = _testset_paths(args)  # a named test set's files, fetched once where not given locally
    source = str(testset[0]) if testset else args.input
    check_input_file(source, "--input")
    fmt = input_format(args, None if testset else source)
    if is_document(args, fmt):
        check_document_options(args, fmt)
        return translate_document(with_stopping_options(engine_translator(args), args), args, source, fmt)
    tr = with_stopping_options(engine_translator(args), args)
    lines = read_input(source)
    if not lines:
        log.warning("%s: no input lines; nothing to translate", source or "standard input")
    constraints = _read_constraints(args.constraints, len(lines), tr) if args.constraints else None
    t0 = time.perf_counter()
    beam_size = args.beam_size or max(tr.config.decode.beam_size, args.nbest)
    results = tr.translate(lines, beam_size=beam_size, batch_size=args.batch_size,
                           length_penalty=args.length_penalty, nbest=args.nbest, constraints=constraints,
                           alignments=args.alignments, alignment_layer=args.alignment_layer,
                           return_token_log_probs=args.scores or args.format == "jsonl", tgt_lang=args.tgt_lang)
    log.info("translated %d lines in %.2f s", len(lines), time.perf_counter() - t0)
    write_output(args.output, format_translations(results, args.format, args.scores, args.nbest,
                                                  tr.confidence if args.format == "jsonl" else None))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from attnmt.data.text import read_parallel
    from attnmt.decode.output import format_scores

    check_output_file(args.output, "--output")
    src, tgt = read_parallel(args.src, args.tgt)
    tr = engine_translator(args)
    results = tr.score(src, tgt, batch_size=args.batch_size, tgt_lang=args.tgt_lang)
    write_output(args.output, format_scores(results, args.format, tr.confidence))
    return 0


def _print_scores(scores: dict, sentences: int, seconds: float) -> None:
    """``evaluate``'s scores for a reader: BLEU, chrF, BLEU's detail, the word-level BLEU where
    there is one, and the count of sentences, the beam size and the time."""
    print(f"BLEU = {scores['bleu']:.2f}  ({scores['bleu_signature']})")
    print(f"chrF = {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    print(scores["bleu_detail"])
    if "bleu_tokenized" in scores:
        print(f"BLEU on word tokens = {scores['bleu_tokenized']:.2f}  ({scores['bleu_tokenized_signature']}; "
              "the model's tokens against the references tokenized as trained)")
    print(f"{sentences} sentences, beam {scores['beam_size']}, {seconds:.1f} s")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from attnmt.data.text import read_parallel
    from attnmt.data.tokenizers import WordTokenizer
    from attnmt.evaluate import corpus_scores, tokenized_bleu

    if args.hyp_output is not None:
        check_output_file(args.hyp_output, "--hyp-output")
    check_stdout("redirect it (the scores are printed)")
    if (args.testset is None) == (args.src is None and args.ref is None):
        raise AttnmtError("give --testset (a named test set such as multi30k:test_2016_flickr) or --src and --ref")
    if args.testset is None and (args.src is None or args.ref is None):
        raise AttnmtError("give both --src and --ref (or --testset)")
    src_path, ref_path = _testset_paths(args) or (args.src, args.ref)
    src, ref = read_parallel(src_path, ref_path)
    if not src:
        raise AttnmtError(f"{src_path}: no sentences to evaluate")
    tr = with_stopping_options(engine_translator(args), args)
    t0 = time.perf_counter()
    translations = tr.translate(src, beam_size=args.beam_size, batch_size=args.batch_size,
                                length_penalty=args.length_penalty, return_token_log_probs=False,
                                tgt_lang=args.tgt_lang)
    seconds = time.perf_counter() - t0
    hyps = [t.text for t in translations]
    scores = corpus_scores(hyps, ref)
    if isinstance(tr.tgt_tokenizer, WordTokenizer):  # also the word-level tutorials' BLEU
        tokens = [[p for p in t.hypotheses[0].pieces if p != "</s>"] for t in translations]
        word = tokenized_bleu(tokens, tr.tgt_tokenizer.tokenize(ref))
        scores.update(bleu_tokenized=word["bleu"], bleu_tokenized_signature=word["bleu_signature"])
    decode = tr.config.decode
    scores.update(beam_size=args.beam_size or decode.beam_size, early_stopping=decode.early_stopping,
                  patience=decode.patience, decode_seconds=round(seconds, 2))
    if args.hyp_output:
        write_output(args.hyp_output, hyps)
    if args.json:
        print(json_line(scores))
    else:
        _print_scores(scores, len(hyps), seconds)
    return 0


def add_translate_parser(sub) -> None:
    p = sub.add_parser("translate", help="translate raw text, one sentence a line, or a document")
    add_decoding_options(p)
    p.add_argument("--input", help="input file (plain or .gz for lines); default stdin")
    add_document_options(p)
    add_testset_options(p, "the source")
    p.add_argument("--output", help="output file; default stdout")
    p.add_argument("--nbest", type=positive_int, default=1, help="hypotheses per sentence (1 to the beam size)")
    p.add_argument("--scores", action="store_true", help="print scores and each token's probability")
    p.add_argument("--format", type=canonical_name, choices=["text", "jsonl"], default="text", help="output format")
    p.add_argument("--constraints", metavar="FILE",
                   help="terms each translation must contain: one line per input line, phrases separated by tabs, "
                        "an empty line for none (lexically constrained beam search)")
    p.add_argument("--alignments", action="store_true",
                   help="add each translation's word alignment: Moses 'i-j' pairs, source-target, 0-based words")
    p.add_argument("--alignment-layer", type=positive_int,
                   help=f"decoder layer of the alignments, 1 to the model's layers (default {DEFAULT_ALIGNMENT_LAYER})")
    add_stopping_options(p)
    add_engine_options(p)
    p.set_defaults(func=cmd_translate)


def add_score_parser(sub) -> None:
    p = sub.add_parser("score", help="log-probability and perplexity of given translations (forced decoding)")
    add_decoding_options(p)
    p.add_argument("--src", required=True, help="source file")
    p.add_argument("--tgt", required=True, help="translations to score, line-aligned with --src")
    p.add_argument("--output", help="output file; default stdout")
    p.add_argument("--format", type=canonical_name, choices=["text", "jsonl"], default="text",
                   help="text: 'ID<TAB>LOG_PROB<TAB>TOKENS<TAB>PPL' per line, then a 'corpus' line")
    add_engine_options(p)
    p.set_defaults(func=cmd_score)


def add_evaluate_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="BLEU and chrF (sacreBLEU) of a model on a test set")
    add_decoding_options(p)
    p.add_argument("--src", help="source file (plain or .gz); or --testset")
    p.add_argument("--ref", help="reference file (plain or .gz), line-aligned with --src")
    add_testset_options(p, "the source and reference")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")
    p.add_argument("--hyp-output", help="also write the translations to this file")
    add_stopping_options(p)
    add_engine_options(p)
    p.set_defaults(func=cmd_evaluate)
