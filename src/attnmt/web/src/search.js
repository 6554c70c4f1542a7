// Greedy and beam search over one sentence, the same algorithms as attnmt.search.greedy and
// attnmt.search.beam (so that the page's outputs equal `attnmt translate` token for token).
//
// A search drives a decoder (see translator.js; tests use a fake one):
//   decoder.step(tokens) -> Promise<{logProbs, attention}>: tokens is the newest token of each of
//     the R rows (hypotheses); logProbs is a Float32Array (R, V) of next-token log-probabilities
//     (forbidden ids at -Infinity); attention is null or a Float32Array (R, A) (A values per row,
//     e.g. L decoder layers x S source tokens), kept with the tokens it produced.
//   decoder.reorder(rows) keeps the cache rows `rows` (an array of R row indices) in that order.
//
// Scores are sums of float32 log-probabilities rounded to float32 after every addition
// (Math.fround), as PyTorch accumulates them; the length penalty is computed in float64 as in Python.
//
// Shapes: R rows, V vocabulary, K beam size, T output tokens.

/**
 * Output length limit floor(a * srcLen + b) tokens (EOS included), between 1 and `limit` (the
 * model's max_positions - 1); computed in float32 like attnmt.search.hypothesis.max_output_lengths.
 * @param {number} srcLen source tokens, EOS included
 */
export function maxOutputLength(srcLen, a, b, limit) {
  const n = Math.floor(Math.fround(Math.fround(Math.fround(a) * srcLen) + b));
  return Math.min(limit, Math.max(1, n));
}

/** GNMT length penalty lp(Y) = ((k + |Y|) / (k + 1))^alpha (Wu et al., 2016, equation 14). */
export function lengthPenalty(length, alpha, k = 5.0) {
  return ((k + length) / (k + 1.0)) ** alpha;
}

/**
 * The score that ranks a hypothesis, attnmt.search.options.SearchOptions.score in float64:
 * 'average': log P / |Y|; 'gnmt': log P in greedy search (beamSize 1), log P / lengthPenalty(|Y|)
 * in beam search. |Y| counts EOS.
 * @param {number} logProb natural-log probability of the hypothesis
 * @param {number} length its tokens, EOS included
 * @param {{lengthPenaltyType?: string, beamSize: number, alpha?: number, k?: number}} opts
 */
export function searchScore(logProb, length, { lengthPenaltyType = "gnmt", beamSize, alpha = 0.6, k = 5.0 }) {
  if (lengthPenaltyType === "average") return logProb / Math.max(length, 1);
  if (beamSize === 1) return logProb;
  return logProb / lengthPenalty(length, alpha, k);
}

/** Index of the largest value of row r of a (R, V) array (the first one on ties, as torch.max). */
function argmaxRow(values, r, V) {
  let best = r * V;
  for (let i = r * V + 1; i < (r + 1) * V; i++) if (values[i] > values[best]) best = i;
  return best - r * V;
}

/**
 * Indices of the `n` largest of `score(i)` for i < count, best first; ties keep the lower index
 * first. A partial insertion sort: n is small (2K), count is V or K * 2K.
 */
function topIndices(count, n, score) {
  const idx = [], val = [];
  for (let i = 0; i < count; i++) {
    const v = score(i);
    if (idx.length === n && !(v > val[n - 1])) continue;
    let j = Math.min(idx.length, n - 1);
    while (j > 0 && v > val[j - 1]) { idx[j] = idx[j - 1]; val[j] = val[j - 1]; j--; }
    idx[j] = i; val[j] = v;
  }
  return idx;
}

/**
 * Greedy search: at each step the most probable token; at the length limit the sentence ends with
 * the token it has just taken, EOS or not (the rule of every search, attnmt.search.beam). Scored by
 * searchScore (log P, or log P / |Y| with lengthPenaltyType 'average').
 * @param decoder see the module comment (one row)
 * @param {{startId: number, eosId: number, limit: number, lengthPenaltyType?: string,
 *          onStep?: (tokens: number[]) => void}} opts
 * @returns {Promise<{tokens: number[], tokenLogProbs: number[], logProb: number, score: number, attention: Float32Array[]}>}
 */
export async function greedySearch(decoder, { startId, eosId, limit, lengthPenaltyType = "gnmt", onStep }) {
  const tokens = [], lps = [], attention = [];
  let last = startId;
  for (let step = 1; ; step++) {
    const { logProbs, attention: att } = await decoder.step([last]);
    const V = logProbs.length;
    const best = argmaxRow(logProbs, 0, V);
    tokens.push(best);
    lps.push(logProbs[best]);
    if (att) attention.push(att.slice());
    if (onStep) onStep(tokens);
    if (best === eosId || limit <= step) break;
    last = best;
  }
  let sum = 0;
  for (const lp of lps) sum = Math.fround(sum + lp);
  return { tokens, tokenLogProbs: lps, logProb: sum, score: searchScore(sum, tokens.length, { lengthPenaltyType, beamSize: 1 }),
           attention };
}

/**
 * Finished hypotheses that end a beam search under early stopping: K x patience rounded half away
 * from zero (attnmt.search.options.finished_wanted, CTranslate2's std::round).
 */
export function finishedWanted(K, patience) {
  return Math.floor(K * patience + 0.5);
}

/**
 * Beam search (attnmt.search.beam): K open hypotheses (one, BOS, at the first step, so the first
 * step runs on one row); of the 2K best one-token extensions, the EOS ones ranked within the first
 * K finish (ranked by searchScore), the K best others stay open. Two stopping rules, as
 * SearchOptions.early_stopping: exact (the default) stops once the best finished hypothesis cannot
 * be beaten by an open one: max(score(s, t + 1), score(s, limit)) <= best finished score. Early
 * stopping (CTranslate2's rule) stops once finishedWanted(K, patience) hypotheses have finished.
 * Under both, at the length limit the K best extensions finish as they are (a hypothesis cut there
 * has no EOS).
 * @param decoder see the module comment (1 row at the first step, then K)
 * @param {{beamSize: number, startId: number, eosId: number, limit: number, lengthPenaltyType?: string,
 *          alpha: number, k: number, earlyStopping?: boolean, patience?: number,
 *          onStep?: (bestOpen: number[]) => void}} opts
 * @returns {Promise<{tokens, tokenLogProbs, logProb, score, attention}>} the best hypothesis
 */
export async function beamSearch(decoder, { beamSize: K, startId, eosId, limit, lengthPenaltyType = "gnmt", alpha, k,
                                            earlyStopping = false, patience = 1.0, onStep }) {
  const width = 2 * K;
  const score = (logProb, length) => searchScore(logProb, length, { lengthPenaltyType, beamSize: K, alpha, k });
  const wanted = earlyStopping ? finishedWanted(K, patience) : null;
  let scores = [0];  // one open hypothesis, BOS; K after the first step
  let hist = [{ tokens: [], lps: [], att: [] }];
  let last = [startId];
  const finished = [];
  for (let t = 0; ; ) {
    const { logProbs, attention } = await decoder.step(last);
    const rows = scores.length, V = logProbs.length / rows;
    if (V < width) throw new Error(`vocabulary (${V}) must hold at least 2 * beam size (${width}) tokens`);
    const cut = limit <= t + 1;  // the length limit: the K best finish as they are
    // Each row's 2K best next tokens, then the 2K best of the rows x 2K.
    const rowTok = [], rowLp = [];
    for (let r = 0; r < rows; r++) {
      const toks = topIndices(V, width, (i) => logProbs[r * V + i]);
      rowTok.push(toks);
      rowLp.push(toks.map((tok) => logProbs[r * V + tok]));
    }
    const cand = (i) => Math.fround(scores[Math.floor(i / width)] + rowLp[Math.floor(i / width)][i % width]);
    const ext = topIndices(rows * width, width, cand).map((i) => ({
      score: cand(i), row: Math.floor(i / width), token: rowTok[Math.floor(i / width)][i % width],
      lp: rowLp[Math.floor(i / width)][i % width],
    }));
    t += 1;
    const attRow = (r) => (attention ? attention.slice(r * (attention.length / rows), (r + 1) * (attention.length / rows)) : null);
    ext.slice(0, K).forEach((e) => {
      if ((e.token !== eosId && !cut) || !Number.isFinite(e.score)) return;
      const h = hist[e.row];
      const tokens = [...h.tokens, e.token];
      finished.push({ tokens, tokenLogProbs: [...h.lps, e.lp], logProb: e.score,
                      score: score(e.score, tokens.length),
                      attention: attention ? [...h.att, attRow(e.row)] : [] });
    });
    // The K best non-EOS extensions stay open, in rank order (EOS ones only when fewer are live).
    const open = [...ext.filter((e) => e.token !== eosId), ...ext.filter((e) => e.token === eosId)].slice(0, K);
    const bestOpen = Math.max(...open.map((e) => e.score));
    let done = limit <= t || bestOpen === -Infinity;
    if (!done && wanted !== null) {
      done = finished.length >= wanted;
    } else if (!done && finished.length >= 1) {
      const bestFinished = Math.max(...finished.map((h) => h.score));
      done = Math.max(score(bestOpen, t + 1), score(bestOpen, limit)) <= bestFinished;
    }
    if (done) break;
    const kept = open.map((e) => e.row);
    if (kept.length !== rows || kept.some((r, i) => r !== i)) decoder.reorder(kept);
    hist = open.map((e) => ({ tokens: [...hist[e.row].tokens, e.token], lps: [...hist[e.row].lps, e.lp],
                              att: attention ? [...hist[e.row].att, attRow(e.row)] : [] }));
    scores = open.map((e) => e.score);
    last = open.map((e) => e.token);
    if (onStep) onStep(hist[0].tokens);
  }
  const ranked = [...finished].sort((a, b) => b.score - a.score);  // stable, as Python's sorted
  return ranked[0] ?? { tokens: [eosId], tokenLogProbs: [-Infinity], logProb: -Infinity, score: -Infinity, attention: [] };
}
