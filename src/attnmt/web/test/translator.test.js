// translator.js's BatchDecoder against a fake decoder-step session that computes what the real
// graph does with its row indices (attnmt.interop.web_graph): each row's cache is the previous
// row `parent` extended by its token, and the rows are groups of B / n, one per sentence of
// `sentence` (n sentences), whose source they use. The next-token
// distribution depends on the sentence and the whole cached prefix, so a wrong row index changes
// the result. Several sentences searched together must give each sentence's search alone.
import assert from "node:assert/strict";
import { test } from "node:test";
import { beamSearch, greedySearch } from "../src/search.js";
import { BatchDecoder, Translator } from "../src/translator.js";

const EOS = 3, START = 2, V = 9;

class Tensor {
  constructor(type, data, dims) {
    this.type = type;
    this.data = data;
    this.dims = dims;
  }
}
const ort = { Tensor };

/** Log-probabilities (V) of the next token after `prefix` in sentence `s`: a fixed pseudo-random
 * distribution per (sentence, prefix), EOS more likely as the prefix grows. */
function distribution(s, prefix) {
  let h = 2166136261 ^ (s * 7919);
  for (const t of prefix) h = Math.imul(h ^ t, 16777619) >>> 0;
  const logits = Array.from({ length: V }, (_, v) => {
    h = Math.imul(h ^ (v + 1), 2246822519) >>> 0;
    return (h % 1000) / 250 + (v === EOS ? prefix.length - 3 : 0);
  });
  const z = Math.log(logits.reduce((a, x) => a + Math.exp(x), 0));
  return Float32Array.from(logits, (x) => x - z);
}

/** The decoder-step graph with one layer, one head and Dh = 1, whose cache holds the tokens. */
function fakeSession() {
  return {
    runs: [],
    async run(feeds) {
      const B = feeds.tokens.dims[0], t = feeds.self_key_0.dims[2];
      const cache = feeds.self_key_0.data, src = feeds.src_key_0.data;
      const parent = Array.from(feeds.parent.data, Number), sentence = Array.from(feeds.sentence.data, Number);
      const K = B / sentence.length;  // each sentence's consecutive rows
      assert.ok(Number.isInteger(K));
      assert.equal(feeds.position.data[0], BigInt(t));
      const next = new Float32Array(B * (t + 1)), logProbs = new Float32Array(B * V);
      for (let b = 0; b < B; b++) {
        next.set(cache.subarray(parent[b] * t, (parent[b] + 1) * t), b * (t + 1));
        next[b * (t + 1) + t] = Number(feeds.tokens.data[b]);
        const prefix = Array.from(next.subarray(b * (t + 1) + 1, (b + 1) * (t + 1)));  // without START
        logProbs.set(distribution(src[sentence[Math.floor(b / K)]], prefix), b * V);
      }
      const out = { log_probs: new Tensor("float32", logProbs, [B, V]),
                    new_self_key_0: new Tensor("float32", next, [B, 1, t + 1, 1]),
                    new_self_value_0: new Tensor("float32", next.slice(), [B, 1, t + 1, 1]) };
      this.runs.push({ feeds, out });
      return out;
    },
  };
}

/** search.js's decoder for one sentence alone, with the same distribution: one row per token
 * it is given (one at the first step). */
function aloneDecoder(s) {
  let prefixes = [[]];
  return {
    async step(tokens) {
      assert.equal(tokens.length, prefixes.length);
      prefixes = prefixes.map((p, r) => [...p, tokens[r]]);
      const out = new Float32Array(tokens.length * V);
      prefixes.forEach((p, r) => out.set(distribution(s, p.slice(1)), r * V));
      return { logProbs: out, attention: null };
    },
    reorder(order) { prefixes = order.map((r) => prefixes[r]); },
  };
}

function batchDecoder(sentences) {
  const N = sentences.length, session = fakeSession();
  const src = new Tensor("float32", Float32Array.from(sentences), [N, 1, 1, 1]);
  return { session, decoder: new BatchDecoder(ort, session, 1, [src, src], new Uint8Array(N).fill(1)) };
}

const sentences = [11, 4, 27, 8, 19];
const limits = [9, 4, 12, 7, 10];

test("beam search of five sentences together equals each sentence's search alone", async () => {
  const K = 3, opts = (i) => ({ beamSize: K, startId: START, eosId: EOS, limit: limits[i], alpha: 1.0, k: 5.0 });
  const { session, decoder } = batchDecoder(sentences);
  const together = await decoder.searchEach((view, i) => beamSearch(view, opts(i)));
  const alone = await Promise.all(sentences.map((s, i) => beamSearch(aloneDecoder(s), opts(i))));
  assert.deepEqual(together, alone);
  assert.ok(new Set(alone.map((h) => h.tokens.length)).size > 2);  // the sentences end at different steps
  // One row per sentence at the first step (its one hypothesis), then K; the rows shrink as
  // sentences end; the caches go back in as they came out (no copy in JavaScript) and a reorder
  // is an index: some step continues rows out of order.
  const rows = session.runs.map((r) => r.feeds.tokens.dims[0]);
  assert.equal(rows[0], sentences.length);
  assert.equal(rows[1], K * sentences.length);
  assert.ok(rows.at(-1) < rows[1] && rows.slice(1).every((b) => b % K === 0));
  assert.ok(session.runs.slice(1).every((r) => r.feeds.sentence.dims[0] * K === r.feeds.tokens.dims[0]));
  session.runs.slice(1).forEach((r, j) => {
    assert.equal(r.feeds.self_key_0, session.runs[j].out.new_self_key_0);
    assert.equal(r.feeds.self_value_0, session.runs[j].out.new_self_value_0);
  });
  assert.ok(session.runs.some((r) => r.feeds.parent.data.some((p, b) => Number(p) !== b)));
});

test("the plain reorder (a copy in JavaScript) gives the same results as the graph's", async () => {
  const K = 3, opts = (i) => ({ beamSize: K, startId: START, eosId: EOS, limit: limits[i], alpha: 1.0, k: 5.0 });
  BatchDecoder.reorderInGraph = false;
  try {
    const { session, decoder } = batchDecoder(sentences);
    const together = await decoder.searchEach((view, i) => beamSearch(view, opts(i)));
    const alone = await Promise.all(sentences.map((s, i) => beamSearch(aloneDecoder(s), opts(i))));
    assert.deepEqual(together, alone);
    assert.ok(session.runs.every((r) => r.feeds.parent.data.every((p, b) => Number(p) === b)));
    assert.notEqual(session.runs[2].feeds.self_key_0, session.runs[1].out.new_self_key_0);  // copied
  } finally {
    BatchDecoder.reorderInGraph = true;
  }
});

test("greedy search together equals greedy search alone; empty caches at the first step", async () => {
  const opts = (i) => ({ startId: START, eosId: EOS, limit: limits[i] });
  const { session, decoder } = batchDecoder(sentences);
  const together = await decoder.searchEach((view, i) => greedySearch(view, opts(i)));
  const alone = await Promise.all(sentences.map((s, i) => greedySearch(aloneDecoder(s), opts(i))));
  assert.deepEqual(together, alone);
  assert.deepEqual(session.runs[0].feeds.self_key_0.dims, [sentences.length, 1, 0, 1]);
  assert.deepEqual(Array.from(session.runs[0].feeds.sentence.data, Number), [0, 1, 2, 3, 4]);
});

test("sentences with different numbers of rows in one step are refused", async () => {
  const { decoder } = batchDecoder(sentences.slice(0, 2));
  const search = (view, i) => (i === 0 ? greedySearch(view, { startId: START, eosId: EOS, limit: 5 })
    : beamSearch(view, { beamSize: 2, startId: START, eosId: EOS, limit: 5, alpha: 1.0, k: 5.0 }));
  await assert.rejects(decoder.searchEach(search), /as many rows each \(1,2\)/);
});

test("a failing session run rejects every search of the batch", async () => {
  const { session, decoder } = batchDecoder(sentences);
  session.run = async () => { throw new Error("out of memory"); };
  await assert.rejects(decoder.searchEach((view, i) => greedySearch(view, { startId: START, eosId: EOS, limit: limits[i] })),
                       /out of memory/);
});

/** A Translator over a fake source tokenizer (one id per character, 10 + its code), no sessions. */
function fakeTranslator(config) {
  const tr = new Translator();
  tr.config = { model: { max_positions: 6 }, ...config };
  tr.srcTokenizer = { encode: (text) => Array.from(text, (c) => 10 + c.charCodeAt(0) - 97) };
  return tr;
}

test("a multilingual model's sources start with the chosen language's tag, within max_positions", () => {
  const tr = fakeTranslator({ target_languages: [{ code: "de", tag_id: 4 }, { code: "fr", tag_id: 5 }] });
  assert.deepEqual(tr.encodeSource("ab", "fr"), [5, 10, 11, EOS]);
  assert.deepEqual(tr.encodeSource("abcdefg", "de"), [4, 10, 11, 12, 13, EOS]);  // the tag takes a position
  assert.throws(() => tr.encodeSource("ab"), /choose one: de, fr/);
  assert.throws(() => tr.encodeSource("ab", "cs"), /unknown target language 'cs'; this model knows de, fr/);
});

test("a bilingual model's sources have no tag; another target language is refused", () => {
  for (const config of [{}, { target_languages: [], tgt_lang: "en" }]) {
    const tr = fakeTranslator(config);
    assert.deepEqual(tr.encodeSource("abcdefg"), [10, 11, 12, 13, 14, EOS]);
    assert.deepEqual(tr.encodeSource("ab", config.tgt_lang), [10, 11, EOS]);
  }
  assert.throws(() => fakeTranslator({ tgt_lang: "en" }).encodeSource("ab", "fr"), /into en only, not 'fr'/);
});

test("language codes are compared ignoring case, the model's exact spelling first", () => {
  const tr = fakeTranslator({ target_languages: [{ code: "de", tag_id: 4 }, { code: "pt_br", tag_id: 5 },
                                                 { code: "pt_BR", tag_id: 6 }] });
  assert.deepEqual(tr.encodeSource("ab", "DE"), [4, 10, 11, EOS]);
  assert.deepEqual(tr.encodeSource("ab", "pt_br"), [5, 10, 11, EOS]);
  assert.deepEqual(tr.encodeSource("ab", "pt_BR"), [6, 10, 11, EOS]);
  assert.deepEqual(fakeTranslator({ tgt_lang: "en" }).encodeSource("ab", "EN"), [10, 11, EOS]);
  assert.throws(() => tr.encodeSource("ab", "PT"), /unknown target language 'PT'/);
});
