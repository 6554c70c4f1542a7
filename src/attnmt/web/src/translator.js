// Raw text in, raw text out in the browser: attnmt's tokenization, the ONNX encoder and
// decoder-step graphs (attnmt.interop.onnx) run by ONNX Runtime Web, and the search of search.js.
//
// The model folder (written by `attnmt export web`) holds config.json, encoder.onnx,
// decoder_step.onnx, the SentencePiece model(s) and the pieces of every id.
//
// Graph inputs and outputs (attnmt.interop.onnx): encoder: src (B, S) int64 -> src_key_l,
// src_value_l (B, H, S, Dh). decoder_step: tokens (B, 1) int64, position (1,) int64, src_mask
// (B, S) bool, self_key_l / self_value_l (B, H, t, Dh), src_key_l / src_value_l -> log_probs
// (B, V), new_self_key_l / new_self_value_l (B, H, t + 1, Dh), attention (B, L, S) (the source
// attention of every decoder layer, averaged over heads).
import { beamSearch, greedySearch, maxOutputLength } from "./search.js";
import { EOS_ID, Tokenizer } from "./tokenizer.js";

/** The decoder-step session with its key/value cache, one row per hypothesis (search.js's decoder). */
class OnnxDecoder {
  constructor(ort, session, config, srcKV, srcLen, rows) {
    this.ort = ort;
    this.session = session;
    this.numLayers = config.num_decoder_layers;
    const [, heads, , headDim] = srcKV[0].dims;
    this.heads = heads;
    this.headDim = headDim;
    this.rows = rows;
    this.position = 0;
    // The source keys and values repeated for the rows, and an all-true mask: one sentence, no padding.
    this.srcKV = srcKV.map((t) => (rows === 1 ? t : new ort.Tensor("float32", repeatRows(t.data, rows), [rows, ...t.dims.slice(1)])));
    this.srcMask = new ort.Tensor("bool", new Uint8Array(rows * srcLen).fill(1), [rows, srcLen]);
    const empty = new ort.Tensor("float32", new Float32Array(0), [rows, heads, 0, headDim]);
    this.selfKV = new Array(2 * this.numLayers).fill(empty);
  }

  async step(tokens) {
    const ort = this.ort, feeds = {
      tokens: new ort.Tensor("int64", BigInt64Array.from(tokens, (t) => BigInt(t)), [tokens.length, 1]),
      position: new ort.Tensor("int64", BigInt64Array.of(BigInt(this.position)), [1]),
      src_mask: this.srcMask,
    };
    for (let l = 0; l < this.numLayers; l++) {
      feeds[`self_key_${l}`] = this.selfKV[2 * l];
      feeds[`self_value_${l}`] = this.selfKV[2 * l + 1];
      feeds[`src_key_${l}`] = this.srcKV[2 * l];
      feeds[`src_value_${l}`] = this.srcKV[2 * l + 1];
    }
    const out = await this.session.run(feeds);
    this.selfKV = [];
    for (let l = 0; l < this.numLayers; l++) this.selfKV.push(out[`new_self_key_${l}`], out[`new_self_value_${l}`]);
    this.position += 1;
    return { logProbs: out.log_probs.data, attention: out.attention ? out.attention.data : null };
  }

  reorder(rows) {
    this.selfKV = this.selfKV.map((t) => new this.ort.Tensor("float32", gatherRows(t.data, rows, this.rows), t.dims));
  }
}

/** A (R, ...) array's rows 0..R-1 each repeated `n` times in place: (R*n, ...) (R = 1 here). */
function repeatRows(data, n) {
  const out = new Float32Array(data.length * n);
  for (let i = 0; i < n; i++) out.set(data, i * data.length);
  return out;
}

/** Rows `rows` of a (R, ...) array with R rows. */
function gatherRows(data, rows, R) {
  const size = data.length / R, out = new Float32Array(data.length);
  rows.forEach((r, i) => out.set(data.subarray(r * size, (r + 1) * size), i * size));
  return out;
}

async function fetchBytes(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function fetchJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

export class Translator {
  /**
   * Load an exported model folder.
   * @param ort the onnxruntime-web module (wasm backend configured by the caller)
   * @param {string} base the folder's URL, ending with '/'
   */
  static async load(ort, base) {
    const config = await fetchJSON(base + "config.json");
    const tok = config.tokenizer;
    const files = [...new Set([tok.src_model, tok.tgt_model])];
    const pieceFiles = [...new Set([tok.src_pieces, tok.tgt_pieces])];
    const [models, pieces, encoder, decoder] = await Promise.all([
      Promise.all(files.map((f) => fetchBytes(base + f))),
      Promise.all(pieceFiles.map((f) => fetchJSON(base + f))),
      fetchBytes(base + config.graphs.encoder),
      fetchBytes(base + config.graphs.decoder_step),
    ]);
    const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
    const tr = new Translator();
    tr.ort = ort;
    tr.config = config;
    tr.encoder = await ort.InferenceSession.create(encoder, options);
    tr.decoder = await ort.InferenceSession.create(decoder, options);
    const modelOf = (f) => models[files.indexOf(f)], piecesOf = (f) => pieces[pieceFiles.indexOf(f)];
    tr.srcTokenizer = await Tokenizer.load(modelOf(tok.src_model), piecesOf(tok.src_pieces), tok.mapped);
    tr.tgtTokenizer = tok.tgt_model === tok.src_model && tok.tgt_pieces === tok.src_pieces ? tr.srcTokenizer
      : await Tokenizer.load(modelOf(tok.tgt_model), piecesOf(tok.tgt_pieces), tok.mapped);
    tr.downloadBytes = models.reduce((n, m) => n + m.length, 0) + encoder.length + decoder.length;
    return tr;
  }

  /** Source ids + EOS, truncated to max_positions - 1 subwords (Translator.encode_sources). */
  encodeSource(text) {
    const ids = this.srcTokenizer.encode(text).slice(0, this.config.model.max_positions - 1);
    return [...ids, EOS_ID];
  }

  /**
   * Translate one sentence.
   * @param {string} text raw text ('' or blanks translate to '')
   * @param {{beamSize?: number, onStep?: (partial: {text: string, pieces: string[]}) => void}} opts
   *   beamSize 1 is greedy search; default the model's decode.beam_size
   * @returns {Promise<{text: string, tokens: number[], pieces: string[], srcPieces: string[],
   *   attention: Float32Array[], score: number, ms: number}>} attention: per output token, the
   *   (L, S) source attention of every decoder layer (head average), flattened
   */
  async translate(text, { beamSize, onStep } = {}) {
    const started = performance.now();
    const dc = this.config.decode, K = beamSize ?? dc.beam_size;
    if (!text.trim()) return { text: "", tokens: [], pieces: [], srcPieces: [], attention: [], score: 0, ms: 0 };
    const src = this.encodeSource(text);
    const srcTensor = new this.ort.Tensor("int64", BigInt64Array.from(src, (t) => BigInt(t)), [1, src.length]);
    const encoded = await this.encoder.run({ src: srcTensor });
    const srcKV = [];
    for (let l = 0; l < this.config.model.num_decoder_layers; l++) srcKV.push(encoded[`src_key_${l}`], encoded[`src_value_${l}`]);
    const decoder = new OnnxDecoder(this.ort, this.decoder, this.config.model, srcKV, src.length, K);
    const limit = maxOutputLength(src.length, dc.max_len_a, dc.max_len_b, this.config.model.max_positions - 1);
    const report = onStep ? (ids) => onStep({ text: this.tgtTokenizer.decode(ids), pieces: this.tgtTokenizer.pieces(ids) }) : undefined;
    const common = { startId: this.config.model.decoder_start_id, eosId: EOS_ID, limit, onStep: report };
    let hyp;
    if (K === 1) {
      hyp = await greedySearch(decoder, common);
    } else {
      const average = dc.length_penalty_type === "average";  // log P / |Y|: alpha 1, k 0
      hyp = await beamSearch(decoder, { ...common, beamSize: K, alpha: average ? 1.0 : dc.length_penalty,
                                        k: average ? 0.0 : dc.length_penalty_k });
    }
    const body = hyp.tokens.at(-1) === EOS_ID ? hyp.tokens.slice(0, -1) : hyp.tokens;
    return {
      text: this.tgtTokenizer.decode(body), tokens: hyp.tokens,
      pieces: [...this.tgtTokenizer.pieces(body), ...(body.length < hyp.tokens.length ? ["</s>"] : [])],
      srcPieces: [...this.srcTokenizer.pieces(src.slice(0, -1)), "</s>"],
      attention: hyp.attention, score: hyp.score, ms: performance.now() - started,
    };
  }
}
