// Raw text in, raw text out: attnmt's tokenization, the ONNX encoder and decoder-step graphs
// (attnmt.interop.onnx, the decoder step rewritten by attnmt.interop.web_graph) run by ONNX
// Runtime Web, and the search of search.js. The page runs it in a Web Worker (worker.js).
//
// The model folder (written by `attnmt export web`) holds config.json, encoder.onnx,
// decoder_step.onnx, the SentencePiece model(s) and the pieces of every id. A multilingual model's
// config.json lists its target languages with the id of each one's tag, which goes in front of the
// source ids (attnmt.languages.source_prefix); a bilingual model's lists none.
//
// Graph inputs and outputs: encoder: src (N, S) int64 (PAD-padded) -> src_key_l, src_value_l
// (N, H, S, Dh) float32. decoder_step: tokens (B, 1) int64, position (1,) int64, src_mask (N, S)
// bool, src_key_l / src_value_l (N, H, S, Dh) once per sentence of the batch, self_key_l /
// self_value_l (P, H, t, Dh) the previous step's caches as they came out, parent (B,) int64 (the
// previous row each row extends) and sentence (n,) int64 (the step's sentences, each with B / n
// consecutive rows that attend to its source row together) -> log_probs (B, V) float32,
// new_self_key_l / new_self_value_l (B, H, t + 1, Dh), attention (B, L, S) (the source attention
// of every decoder layer, averaged over heads). The graph gathers the cache and source rows itself
// (attnmt.interop.web_graph), so a reorder here is an index, never a copy of the caches.
import { beamSearch, greedySearch, maxOutputLength } from "./search.js";
import { EOS_ID, PAD_ID, Tokenizer } from "./tokenizer.js";

/** Rows `rows` of a (R, ...) array with R rows: (rows.length, ...), a copy. */
function gatherRows(data, rows, R) {
  const size = data.length / R, out = new Float32Array(rows.length * size);
  rows.forEach((r, i) => out.set(data.subarray(r * size, (r + 1) * size), i * size));
  return out;
}

/** Sentences searched together by translateBatch (its default). */
export const BATCH_SIZE = 32;

/** Whether two language codes name one language: compared ignoring case, as attnmt does
 * (attnmt.languages.same_language): 'EN' is 'en', 'pt_br' is 'pt_BR'. */
export function sameLanguage(a, b) {
  return a.toLowerCase() === b.toLowerCase();
}

const int64 = (ort, values, dims) => new ort.Tensor("int64", BigInt64Array.from(values, (v) => BigInt(v)), dims);

/**
 * The decoder-step session for N sentences searched together, one search.js search each, in
 * lockstep: every live search asks for one step (`view(i).step`), and once all have asked (or
 * finished: `leave(i)`), one session run computes the rows of all of them, sentence by sentence.
 * The key/value caches stay the ONNX Runtime tensors the previous run returned; a search's
 * `reorder(rows)` only records rows, which the next run's `parent` index applies inside the graph.
 */
export class BatchDecoder {
  /**
   * @param srcKV the encoder's 2L outputs (N, H, S, Dh), layer by layer (key, value)
   * @param {Uint8Array} srcMask (N, S) 1 on real source tokens
   */
  constructor(ort, session, numLayers, srcKV, srcMask) {
    this.ort = ort;
    this.session = session;
    this.numLayers = numLayers;
    const [N, heads, S, headDim] = srcKV[0].dims;
    this.heads = heads;
    this.headDim = headDim;
    this.srcKV = srcKV;
    this.srcMask = new ort.Tensor("bool", srcMask, [N, S]);
    this.live = new Set(Array.from({ length: N }, (_, i) => i));
    this.pending = new Map();  // sentence -> {tokens, resolve, reject}: its request for the next step
    this.reorders = new Map();  // sentence -> the rows of its previous step it keeps, in order
    this.offsets = new Map();  // sentence -> [first row, row count] in the previous step's output
    this.selfKV = null;  // the previous step's new_self_key_l / new_self_value_l, (P, H, t, Dh)
    this.position = 0;
  }

  /**
   * Speed switch: true, the graph gathers the kept cache rows itself (the `parent` input), and the
   * caches go back in as they came out; false, the plain way: every layer's kept rows are copied
   * here before the run, and `parent` is the identity.
   */
  static reorderInGraph = true;

  /** The decoder interface of search.js for sentence `i`. */
  view(i) {
    return {
      step: (tokens) => new Promise((resolve, reject) => {
        this.pending.set(i, { tokens, resolve, reject });
        this.runWhenReady();
      }),
      reorder: (rows) => {
        const before = this.reorders.get(i);  // two reorders between steps compose
        this.reorders.set(i, before ? rows.map((r) => before[r]) : rows);
      },
    };
  }

  /**
   * Run `search(decoder, i)` (a search.js search over `decoder`) for every sentence i, together.
   * @returns {Promise<any[]>} each search's result, by sentence
   */
  searchEach(search) {
    return Promise.all([...this.live].map(async (i) => {
      try {
        return await search(this.view(i), i);
      } finally {
        this.leave(i);
      }
    }));
  }

  /** Sentence `i`'s search has ended: it takes no more rows. */
  leave(i) {
    this.live.delete(i);
    this.pending.delete(i);
    this.runWhenReady();
  }

  runWhenReady() {
    if (this.pending.size === 0 || this.pending.size < this.live.size) return;
    const requests = [...this.pending].sort((a, b) => a[0] - b[0]);
    this.pending = new Map();
    this.run(requests).catch((e) => requests.forEach(([, r]) => r.reject(e)));
  }

  async run(requests) {
    const ort = this.ort, tokens = [], parent = [], sentence = [], offsets = new Map();
    for (const [i, { tokens: t }] of requests) {
      const kept = this.reorders.get(i) ?? t.map((_, r) => r);
      const [first, count] = this.offsets.get(i) ?? [tokens.length, t.length];  // step 0: the rows as asked
      if (kept.length !== t.length || kept.some((r) => r >= count)) {
        throw new Error(`sentence ${i}: ${t.length} tokens for ${kept.length} kept rows of ${count}`);
      }
      offsets.set(i, [tokens.length, t.length]);
      tokens.push(...t);
      parent.push(...kept.map((r) => first + r));
      sentence.push(i);
    }
    const B = tokens.length;
    if (requests.some(([, r]) => r.tokens.length * requests.length !== B)) {  // the graph's K = B / n
      throw new Error(`the sentences of a step must have as many rows each (${requests.map(([, r]) => r.tokens.length)})`);
    }
    if (!BatchDecoder.reorderInGraph && this.selfKV) {  // the plain way: copy the kept rows of every layer here
      this.selfKV = this.selfKV.map((t) => new ort.Tensor("float32", gatherRows(t.data, parent, t.dims[0]),
                                                           [B, ...t.dims.slice(1)]));
      parent.forEach((_, b) => { parent[b] = b; });
    }
    const feeds = {
      tokens: int64(ort, tokens, [B, 1]), position: int64(ort, [this.position], [1]), src_mask: this.srcMask,
      parent: int64(ort, parent, [B]), sentence: int64(ort, sentence, [sentence.length]),
    };
    const empty = this.selfKV ? null : new ort.Tensor("float32", new Float32Array(0), [B, this.heads, 0, this.headDim]);
    for (let l = 0; l < this.numLayers; l++) {
      feeds[`self_key_${l}`] = this.selfKV ? this.selfKV[2 * l] : empty;
      feeds[`self_value_${l}`] = this.selfKV ? this.selfKV[2 * l + 1] : empty;
      feeds[`src_key_${l}`] = this.srcKV[2 * l];
      feeds[`src_value_${l}`] = this.srcKV[2 * l + 1];
    }
    const out = await this.session.run(feeds);
    this.selfKV = [];
    for (let l = 0; l < this.numLayers; l++) this.selfKV.push(out[`new_self_key_${l}`], out[`new_self_value_${l}`]);
    this.position += 1;
    this.offsets = offsets;
    this.reorders = new Map();
    const logProbs = out.log_probs.data, V = logProbs.length / B;
    const attention = out.attention ? out.attention.data : null, A = attention ? attention.length / B : 0;
    for (const [i, request] of requests) {
      const [first, count] = offsets.get(i);
      request.resolve({ logProbs: logProbs.subarray(first * V, (first + count) * V),
                        attention: attention ? attention.subarray(first * A, (first + count) * A) : null });
    }
  }
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

  /** The model's target languages, [{code, tag_id}] ([] for a bilingual model). */
  get targetLanguages() {
    return this.config.target_languages ?? [];
  }

  /**
   * The ids in front of every source (attnmt.languages.source_prefix): [tag id of `tgtLang`] for a
   * multilingual model, [] for a bilingual one.
   * @param {string | undefined} tgtLang the language to translate into (required by a multilingual
   *   model; a bilingual one takes none or its own)
   * @throws {Error} a multilingual model without `tgtLang`, or a language the model does not know
   */
  sourcePrefix(tgtLang) {
    const known = this.targetLanguages, codes = known.map((l) => l.code).join(", ");
    if (!known.length) {
      const own = this.config.tgt_lang;
      if (tgtLang && own && !sameLanguage(tgtLang, own)) {
        throw new Error(`this model translates into ${own} only, not '${tgtLang}'`);
      }
      return [];
    }
    if (!tgtLang) throw new Error(`this model translates into several languages: choose one: ${codes}`);
    // codes compared ignoring case, the exact spelling first (attnmt.languages.spelling)
    const lang = known.find((l) => l.code === tgtLang) ?? known.find((l) => sameLanguage(l.code, tgtLang));
    if (!lang) throw new Error(`unknown target language '${tgtLang}'; this model knows ${codes}`);
    return [lang.tag_id];
  }

  /** Source ids + EOS, truncated to max_positions - 1 ids, a multilingual model's starting with the
   * tag of `tgtLang` (Translator.encode_sources). */
  encodeSource(text, tgtLang) {
    const prefix = this.sourcePrefix(tgtLang);
    const ids = this.srcTokenizer.encode(text).slice(0, this.config.model.max_positions - 1 - prefix.length);
    return [...prefix, ...ids, EOS_ID];
  }

  /**
   * Translate one sentence.
   * @param {string} text raw text ('' or blanks translate to '')
   * @param {{beamSize?: number, tgtLang?: string,
   *   onStep?: (partial: {text: string, pieces: string[]}) => void}} opts
   *   beamSize 1 is greedy search; default the model's decode.beam_size; tgtLang the language to
   *   translate into (sourcePrefix); onStep gets the words so far after every step (with beam
   *   search, the best open hypothesis)
   * @returns {Promise<{text: string, tokens: number[], pieces: string[], srcPieces: string[],
   *   attention: Float32Array[], score: number, ms: number}>} attention: per output token, the
   *   (L, S) source attention of every decoder layer (head average), flattened
   */
  async translate(text, { beamSize, tgtLang, onStep } = {}) {
    return (await this.translateBatch([text], { beamSize, tgtLang, onStep }))[0];
  }

  /**
   * Translate sentences, `batchSize` at a time searched together (one session run per step for
   * all their hypotheses; sentences sorted by length first, as attnmt.search.batched does). Each
   * sentence's search is translate()'s, so the results do not depend on the batch.
   * @param {string[]} texts raw texts
   * @param {{beamSize?: number, batchSize?: number, tgtLang?: string, onStep?: Function}} opts
   *   batchSize default BATCH_SIZE; tgtLang translate()'s, for all; onStep (translate()'s) only for
   *   a single sentence
   * @returns {Promise<object[]>} translate()'s result per text, in order; ms is the batch's time
   * @throws {Error} sourcePrefix's, before any work
   */
  async translateBatch(texts, { beamSize, batchSize = BATCH_SIZE, tgtLang, onStep } = {}) {
    this.sourcePrefix(tgtLang);  // a missing or unknown language is refused even for blank texts
    const sources = texts.map((text) => (text.trim() ? this.encodeSource(text, tgtLang) : null));
    const order = sources.map((_, i) => i).filter((i) => sources[i] !== null)
      .sort((a, b) => sources[a].length - sources[b].length || a - b);  // stable: equal lengths keep their order
    const results = texts.map(() => ({ text: "", tokens: [], pieces: [], srcPieces: [], attention: [], score: 0, ms: 0 }));
    for (let start = 0; start < order.length; start += batchSize) {
      const chunk = order.slice(start, start + batchSize);
      const started = performance.now();
      const hyps = await this.searchBatch(chunk.map((i) => sources[i]), beamSize, texts.length === 1 ? onStep : undefined);
      const ms = performance.now() - started;
      chunk.forEach((i, j) => { results[i] = this.result(sources[i], hyps[j], ms); });
    }
    return results;
  }

  /** The best hypothesis of each source (ids ending with EOS), all searched together. */
  async searchBatch(sources, beamSize, onStep) {
    const dc = this.config.decode, K = beamSize ?? dc.beam_size, N = sources.length;
    const S = Math.max(...sources.map((s) => s.length));
    const src = new BigInt64Array(N * S).fill(BigInt(PAD_ID)), mask = new Uint8Array(N * S);
    sources.forEach((s, i) => s.forEach((t, j) => { src[i * S + j] = BigInt(t); mask[i * S + j] = 1; }));
    const encoded = await this.encoder.run({ src: new this.ort.Tensor("int64", src, [N, S]) });
    const L = this.config.model.num_decoder_layers, srcKV = [];
    for (let l = 0; l < L; l++) srcKV.push(encoded[`src_key_${l}`], encoded[`src_value_${l}`]);
    const decoder = new BatchDecoder(this.ort, this.decoder, L, srcKV, mask);
    const report = onStep ? (ids) => onStep({ text: this.tgtTokenizer.decode(ids), pieces: this.tgtTokenizer.pieces(ids) }) : undefined;
    return decoder.searchEach((view, i) => {
      const limit = maxOutputLength(sources[i].length, dc.max_len_a, dc.max_len_b, this.config.model.max_positions - 1);
      const common = { startId: this.config.model.decoder_start_id, eosId: EOS_ID, limit, onStep: report,
                       lengthPenaltyType: dc.length_penalty_type ?? "gnmt" };
      return K === 1 ? greedySearch(view, common)
        : beamSearch(view, { ...common, beamSize: K, alpha: dc.length_penalty, k: dc.length_penalty_k,
                             earlyStopping: dc.early_stopping ?? false, patience: dc.patience ?? 1.0 });
    });
  }

  /** translate()'s result for a source (ids + EOS) and its best hypothesis. */
  result(src, hyp, ms) {
    const body = hyp.tokens.at(-1) === EOS_ID ? hyp.tokens.slice(0, -1) : hyp.tokens;
    return {
      text: this.tgtTokenizer.decode(body), tokens: hyp.tokens,
      pieces: [...this.tgtTokenizer.pieces(body), ...(body.length < hyp.tokens.length ? ["</s>"] : [])],
      srcPieces: [...this.srcTokenizer.pieces(src.slice(0, -1)), "</s>"],
      attention: hyp.attention, score: hyp.score, ms,
    };
  }
}
