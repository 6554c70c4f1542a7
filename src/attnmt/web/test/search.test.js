// The search of search.js against hand-computed cases, with a fake decoder whose next-token
// distribution depends only on the prefix (as fairseq's beam search tests do).
import assert from "node:assert/strict";
import { test } from "node:test";
import { beamSearch, finishedWanted, greedySearch, lengthPenalty, maxOutputLength } from "../src/search.js";

const EOS = 3, START = 2, V = 8;

/**
 * A decoder whose log-probabilities come from `table(prefix)`: a {token: prob} map (the rest of
 * the mass spread evenly), one row per token it is given (at most `rows`; one at the start).
 * Records the row count of each step and the reorders it is asked for.
 */
function fakeDecoder(rows, table) {
  return {
    prefixes: [[]],
    reorders: [],
    rowsPerStep: [],
    async step(tokens) {
      assert.ok(tokens.length <= rows && tokens.length === this.prefixes.length);
      this.rowsPerStep.push(tokens.length);
      this.prefixes = this.prefixes.map((p, r) => [...p, tokens[r]]);
      const out = new Float32Array(tokens.length * V);
      this.prefixes.forEach((p, r) => {
        const probs = table(p.slice(1));
        const rest = (1 - Object.values(probs).reduce((a, b) => a + b, 0)) / (V - Object.keys(probs).length);
        for (let v = 0; v < V; v++) out[r * V + v] = Math.log(probs[v] ?? rest);
      });
      return { logProbs: out, attention: Float32Array.from({ length: tokens.length }, (_, r) => r) };
    },
    reorder(order) {
      this.reorders.push(order);
      this.prefixes = order.map((r) => this.prefixes[r]);
    },
  };
}

test("maxOutputLength is floor(a * n + b) in float32, clamped to [1, limit]", () => {
  assert.equal(maxOutputLength(10, 1.5, 10, 100), 25);
  assert.equal(maxOutputLength(7, 1.2, 0, 100), 8);  // 8.4
  assert.equal(maxOutputLength(10, 1.5, 10, 20), 20);
  assert.equal(maxOutputLength(1, 0, 0, 20), 1);
  // float32(1.1) * 10 = 11.0000002 in float32 arithmetic: still 11
  assert.equal(maxOutputLength(10, 1.1, 0, 100), 11);
});

test("lengthPenalty is ((k + |Y|) / (k + 1))^alpha", () => {
  assert.equal(lengthPenalty(7, 0.6, 5), (12 / 6) ** 0.6);
  assert.equal(lengthPenalty(7, 0, 5), 1);
  assert.equal(lengthPenalty(4, 1, 0), 4);
});

test("greedy search takes the most probable token and ends at the length limit without EOS", async () => {
  const table = (p) => (p.length < 2 ? { [5 + p.length]: 0.6 } : { [EOS]: 0.7 });
  const hyp = await greedySearch(fakeDecoder(1, table), { startId: START, eosId: EOS, limit: 10 });
  assert.deepEqual(hyp.tokens, [5, 6, EOS]);
  assert.ok(Math.abs(hyp.logProb - (2 * Math.log(0.6) + Math.log(0.7))) < 1e-5);
  const cut = await greedySearch(fakeDecoder(1, () => ({ 4: 0.9 })), { startId: START, eosId: EOS, limit: 3 });
  assert.deepEqual(cut.tokens, [4, 4, 4]);
  assert.ok(Math.abs(cut.logProb - 3 * Math.log(0.9)) < 1e-5);
  assert.equal(cut.attention.length, 3);
});

test("greedy takes the first of equal maxima, as torch.max", async () => {
  const hyp = await greedySearch(fakeDecoder(1, () => ({ 5: 0.4, 6: 0.4 })), { startId: START, eosId: EOS, limit: 2 });
  assert.deepEqual(hyp.tokens, [5, 5]);
});

// The first token: 4 (p 0.5) ends right after (EOS 0.9); 5 (p 0.4) goes on with 6 (0.95), then EOS (0.95).
const forked = (p) => {
  if (p.length === 0) return { 4: 0.5, 5: 0.4 };
  if (p[0] === 4) return { [EOS]: 0.9 };
  return p.length === 1 ? { 6: 0.95 } : { [EOS]: 0.95 };
};

test("beam search ranks finished hypotheses by log P / lp(|Y|)", async () => {
  const short = Math.log(0.5) + Math.log(0.9), long = Math.log(0.4) + 2 * Math.log(0.95);
  // alpha 0: log P alone; the short one wins (-0.799 > -1.019)
  const decoder = fakeDecoder(2, forked);
  let hyp = await beamSearch(decoder, { beamSize: 2, startId: START, eosId: EOS, limit: 10, alpha: 0, k: 5 });
  assert.deepEqual(hyp.tokens, [4, EOS]);
  assert.ok(Math.abs(hyp.score - short) < 1e-5);
  assert.deepEqual(decoder.rowsPerStep.slice(0, 2), [1, 2]);  // one hypothesis (BOS) at the first step, then K
  // alpha 1, k 0 (average log-probability): -0.400 (short) < -0.340 (long): the long one wins
  hyp = await beamSearch(fakeDecoder(2, forked), { beamSize: 2, startId: START, eosId: EOS, limit: 10, alpha: 1, k: 0 });
  assert.deepEqual(hyp.tokens, [5, 6, EOS]);
  assert.ok(Math.abs(hyp.score - long / 3) < 1e-5);
  assert.ok(Math.abs(hyp.logProb - long) < 1e-5);
  assert.equal(hyp.tokenLogProbs.length, 3);
});

test("beam search stops at the length limit without EOS, and reorders the cache rows", async () => {
  const dec = fakeDecoder(2, () => ({ 4: 0.5, 5: 0.3 }));
  const hyp = await beamSearch(dec, { beamSize: 2, startId: START, eosId: EOS, limit: 3, alpha: 0.6, k: 5 });
  assert.deepEqual(hyp.tokens, [4, 4, 4]);
  assert.deepEqual(dec.reorders[0], [0, 0]);  // after step 1 both beams extend the only live row
});

test("beam size 1 equals greedy search", async () => {
  const table = (p) => (p.length < 3 ? { [4 + (p.length % 3)]: 0.5 } : { [EOS]: 0.6 });
  const g = await greedySearch(fakeDecoder(1, table), { startId: START, eosId: EOS, limit: 10 });
  const b = await beamSearch(fakeDecoder(1, table), { beamSize: 1, startId: START, eosId: EOS, limit: 10, alpha: 0.6, k: 5 });
  assert.deepEqual(b.tokens, g.tokens);
});

// The stopping rules as tests/test_search_stopping.py checks them in Python. Step 1: A 0.5, EOS
// 0.3, B 0.2; [EOS] finishes. Step 2: [A, C] 0.45 and [B, EOS] 0.2 are the two best; [B, EOS]
// finishes, the second finished hypothesis. Step 3: [A, C, EOS] 0.45 finishes, better than both.
const A = 4, B = 5, C = 6;
const lateWinner = (p) => {
  const key = p.join(",");
  if (key === "") return { [A]: 0.5, [EOS]: 0.3, [B]: 0.2 };
  if (key === `${A}`) return { [C]: 0.9, [EOS]: 0.1 - 1e-9 };
  return { [EOS]: 1 - 1e-9 };
};
const lateOpts = { beamSize: 2, startId: START, eosId: EOS, limit: 10, alpha: 0, k: 5 };

test("early stopping ends at K finished hypotheses; exact stopping waits for the better one", async () => {
  const early = await beamSearch(fakeDecoder(2, lateWinner), { ...lateOpts, earlyStopping: true });
  assert.deepEqual(early.tokens, [EOS]);
  const exact = await beamSearch(fakeDecoder(2, lateWinner), lateOpts);
  assert.deepEqual(exact.tokens, [A, C, EOS]);
});

test("patience waits for round(K x patience) finished hypotheses", async () => {
  assert.equal(finishedWanted(4, 1.125), 5);  // 4.5 -> 5, half away from zero
  assert.equal(finishedWanted(4, 1.1), 4);
  const hyp = await beamSearch(fakeDecoder(2, lateWinner), { ...lateOpts, earlyStopping: true, patience: 1.5 });
  assert.deepEqual(hyp.tokens, [A, C, EOS]);
});

test("at the length limit both stopping rules finish hypotheses without EOS", async () => {
  const table = () => ({ [A]: 0.9, [B]: 0.1 - 1e-6 });
  const opts = { beamSize: 2, startId: START, eosId: EOS, limit: 3, alpha: 1, k: 5 };
  const early = await beamSearch(fakeDecoder(2, table), { ...opts, earlyStopping: true });
  assert.deepEqual(early.tokens, [A, A, A]);
  assert.ok(Math.abs(early.score - (3 * Math.log(0.9)) / lengthPenalty(3, 1, 5)) < 1e-5);
  const exact = await beamSearch(fakeDecoder(2, table), opts);
  assert.deepEqual(exact.tokens, [A, A, A]);
  assert.equal(exact.score, early.score);
});
