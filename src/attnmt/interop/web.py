"""Export a model directory as a static web page that translates in the browser, offline.

``attnmt export web --model MODEL_DIR --output SITE_DIR [--quantization int8]`` writes::

    SITE_DIR/index.html                   the page (text box, translate button, heatmap)
    SITE_DIR/attnmt.js                    its module: search, tokenization, ONNX Runtime Web's API
    SITE_DIR/attnmt.js.LEGAL.txt          the licence notices of the bundled libraries
    SITE_DIR/ort-wasm-simd-threaded.mjs   ONNX Runtime Web's WebAssembly backend (SIMD, threads)
    SITE_DIR/ort-wasm-simd-threaded.wasm
    SITE_DIR/model/config.json            special ids, decoder start id, forbidden ids, length
                                          limits, length penalty, beam size, graph and tokenizer files,
                                          a multilingual model's target languages and their tag ids
    SITE_DIR/model/encoder.onnx           the graphs of :mod:`attnmt.interop.onnx`, the decoder step
    SITE_DIR/model/decoder_step.onnx      with its ``attention`` output and the row indices of
                                          :mod:`attnmt.interop.web_graph` (int8: dynamically quantized)
    SITE_DIR/model/*.spm.model, spm.model the SentencePiece model(s), language tags as control symbols
    SITE_DIR/model/*pieces.json, vocab.json  the piece of every id (MarianMT: its shared vocabulary)

Any static file server serves it (``python -m http.server``). The page runs ONNX Runtime Web's
WebAssembly backend with SIMD, on several threads where the page is cross-origin isolated
(served with ``Cross-Origin-Opener-Policy: same-origin`` and ``Cross-Origin-Embedder-Policy:
require-corp``), on one thread otherwise; it fetches nothing from another origin.

The JavaScript side (``attnmt/web``: package.json, its lockfile, the sources and the tests) is
bundled with esbuild into ``attnmt/web/dist`` when the package is built: ``pip install`` (editable
or not) and ``pip wheel`` run ``npm ci && npm run build`` there where npm is on PATH
(``setup.py``, :mod:`attnmt.interop.web_bundle`). The export copies that folder, so it needs
neither Node nor the network, and refuses a bundle older than its sources. Its search is attnmt's (greedy and beam search with the same
length limits and length penalty, :mod:`attnmt.search`), so the page's outputs equal
``attnmt translate``'s token for token, up to float rounding in near ties.

A multilingual model (``attnmt.languages``): config.json's ``target_languages`` lists
``{"code", "tag_id"}`` per target language ([] for a bilingual model); the page shows a language
picker where there are several, and puts the chosen language's tag id in front of the source ids
(``attnmt.languages.source_prefix``), as ``attnmt translate --tgt-lang`` does.

int8: ``onnxruntime.quantization.quantize_dynamic`` (weights int8 per tensor, activations
quantized at run time, MatMulInteger), the graphs' MatMul and Gather weights.

Library: onnx, onnxruntime (``pip install 'attnmt[export]'``); onnxruntime-web, esbuild and
@sctg/sentencepiece-js (SentencePiece compiled to WebAssembly) on the JavaScript side.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

from attnmt import languages, rundir
from attnmt.config import DEFAULT_ATTENTION_LAYER, canonical_name
from attnmt.data.shards import staging_dir
from attnmt.data.tokenizers import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, VocabTokenizer,
                                    reserved_as_control)
from attnmt.errors import AttnmtError, CheckpointError, library_call
from attnmt.interop import web_bundle
from attnmt.interop.extras import require
from attnmt.interop.onnx import DECODER_STEP, ENCODER, export_onnx
from attnmt.interop.web_graph import gather_rows_in_graph

log = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
QUANTIZATIONS = ("float32", "int8")


def assets_dir(web_dir: Path | None = None) -> Path:
    """The bundled page (``dist/`` of ``web_dir``, by default ``attnmt/web``), checked against its
    sources where they are present.

    Raises:
        AttnmtError: it is not built (a wheel built without npm, or a source checkout installed
            without npm on PATH), or, in a source checkout, a source changed since it was built.
    """
    web_dir = web_dir or WEB_DIR
    dist = web_dir / "dist"
    missing = web_bundle.missing_assets(dist)
    if missing and not (web_dir / "package.json").is_file():  # an installed wheel: no sources to build from
        raise AttnmtError(f"this attnmt installation has no web page (its wheel was built without npm); install "
                          f"{web_bundle.BUILD_PACKAGES}, then reinstall attnmt from its source with them on PATH "
                          f"(pip install . in a clone)")
    if missing:
        raise AttnmtError(f"{dist}: the web page is not built ({', '.join(missing)} missing); with "
                          f"{web_bundle.BUILD_PACKAGES} installed, rebuild it: pip install -e {web_dir.parents[2]}, "
                          f"or cd {web_dir} && npm ci && npm run build")
    changed = web_bundle.changed_sources(web_dir)
    if changed:
        raise AttnmtError(f"{dist}: the web page is older than its sources ({', '.join(changed[:3])}"
                          f"{' ...' if len(changed) > 3 else ''} changed since it was built); rebuild it: "
                          f"cd {web_dir} && npm run build")
    return dist


def _quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of a graph's weights (onnxruntime.quantization)."""
    require("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def shown(record: logging.LogRecord) -> bool:  # not its INFO lines, nor its advice to pre-process
        return record.levelno > logging.INFO and "pre-processing before quantization" not in record.getMessage()

    root = logging.getLogger()  # the quantizer logs an INFO line per tensor straight to the root logger
    root.addFilter(shown)  # (a root filter sees only the root's own records, not attnmt's)
    try:
        with library_call("ONNX Runtime's int8 quantizer (quantize_dynamic)", "export the page without "
                          "quantization (--quantization float32)", (RuntimeError, ValueError)):
            quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(shown)


def _tokenizer_files(model_dir: Path, src_tok, tgt_tok, out: Path) -> dict:
    """Copy the SentencePiece model(s) into ``out``, write the pieces of every id, and return
    config.json's ``tokenizer`` section."""
    if not isinstance(src_tok, Tokenizer) or not isinstance(tgt_tok, Tokenizer):
        raise CheckpointError(f"{model_dir}: word-level tokenizers (spaCy) cannot run in the browser; the web "
                              "export needs SentencePiece models")
    mapped = isinstance(src_tok, VocabTokenizer)
    if mapped:  # MarianMT: two SentencePiece models over one vocabulary
        names = {"src_model": rundir.SRC_SPM, "tgt_model": rundir.TGT_SPM,
                 "src_pieces": rundir.VOCAB, "tgt_pieces": rundir.VOCAB}
        shutil.copyfile(model_dir / rundir.VOCAB, out / rundir.VOCAB)
    elif src_tok is tgt_tok:
        names = {"src_model": rundir.JOINT_SPM, "tgt_model": rundir.JOINT_SPM,
                 "src_pieces": "pieces.json", "tgt_pieces": "pieces.json"}
    else:
        names = {"src_model": rundir.SRC_SPM, "tgt_model": rundir.TGT_SPM,
                 "src_pieces": "src.pieces.json", "tgt_pieces": "tgt.pieces.json"}
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        # the page encodes user text with this file: reserved pieces (language tags) as control
        # symbols, so that text spelling one is ordinary characters, as in Python (Tokenizer.encode)
        (out / names[f"{side}_model"]).write_bytes(reserved_as_control(tok.model_proto))
        if not mapped:
            pieces = tok.pieces(list(range(len(tok))))
            (out / names[f"{side}_pieces"]).write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")
    return {**names, "mapped": mapped}


def export_web(model_dir: str | Path, output: str | Path, quantization: str | None = None) -> Path:
    """Write the static site (module docstring) for a model directory into ``output``.

    The site is assembled in a temporary folder beside ``output`` and renamed into place, so a
    failure leaves no half-written site.

    Args:
        model_dir: a trained, fine-tuned or imported (MarianMT) model directory with SentencePiece
            tokenizers.
        output: the folder to create (absent or empty).
        quantization: None or 'float32' (the weights as trained), or 'int8'.
    Raises:
        CheckpointError: ``output`` is not empty, the model directory is incomplete, or its
            tokenizers are word-level.
        LanguageError: a target language whose tag is not in the source vocabulary.
        AttnmtError: the page is not built (:func:`assets_dir`), onnx/onnxruntime missing (the
            ``export`` extra), or an unknown quantization.
    """
    quantization = canonical_name(quantization or "float32")
    if quantization not in QUANTIZATIONS:
        raise AttnmtError(f"web export: quantization {quantization!r} is not one of {', '.join(QUANTIZATIONS)}")
    model_dir, output = Path(model_dir), Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise CheckpointError(f"{output}: exists and is not empty; choose a new directory")
    assets = assets_dir()
    config = rundir.read_config(model_dir)
    src_tok, tgt_tok = rundir.read_tokenizers(model_dir)
    targets = [{"code": lang, "tag_id": languages.source_prefix(config, src_tok, lang)[0]}
               for lang in config.tokenizer.target_languages]  # checked before any work
    with staging_dir(output, empty_ok=True) as site, tempfile.TemporaryDirectory(prefix="attnmt-web-") as tmp:
        graphs, model_out = Path(tmp) / "onnx", site / "model"
        model_out.mkdir(parents=True)
        tokenizer = _tokenizer_files(model_dir, src_tok, tgt_tok, model_out)
        export_onnx(model_dir, graphs, attention=True)
        gather_rows_in_graph(graphs / DECODER_STEP)  # the page's reorder: an index input, no cache copy
        for name in (ENCODER, DECODER_STEP):
            if quantization == "int8":
                _quantize_int8(graphs / name, model_out / name)
            else:
                shutil.copyfile(graphs / name, model_out / name)
        for name in web_bundle.ASSET_FILES:
            shutil.copyfile(assets / name, site / name)
        m, d = config.model, config.decode
        pair = config.data.pair if config.data is not None and config.data.pair else None
        web_config = {
            "format": "attnmt-web", "version": 1, "quantization": quantization,
            "graphs": {"encoder": ENCODER, "decoder_step": DECODER_STEP},
            "tokenizer": tokenizer,
            "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
            "model": {"d_model": m.d_model, "num_heads": m.num_heads, "num_encoder_layers": m.num_encoder_layers,
                      "num_decoder_layers": m.num_decoder_layers, "max_positions": m.max_positions,
                      "decoder_start_id": m.decoder_start_id, "forbidden_ids": list(m.forbidden_ids),
                      "src_vocab_size": len(src_tok), "tgt_vocab_size": len(tgt_tok)},
            "decode": {"beam_size": d.beam_size, "length_penalty": d.length_penalty,
                       "length_penalty_k": d.length_penalty_k, "length_penalty_type": d.length_penalty_type,
                       "max_len_a": d.max_len_a, "max_len_b": d.max_len_b,
                       "early_stopping": d.early_stopping, "patience": d.patience},
            "attention_layer": DEFAULT_ATTENTION_LAYER,
            "src_lang": pair.split("-")[0] if pair else None, "tgt_lang": pair.split("-")[1] if pair else None,
            "target_languages": targets,
        }
        (model_out / "config.json").write_text(json.dumps(web_config, indent=1), encoding="utf-8")
    log.info("wrote the web page to %s (%s); serve it with: python -m http.server -d %s", output, quantization, output)
    return output
