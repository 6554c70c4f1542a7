// The exported page: a text box, a translate button, words appearing as they are decoded, the
// time per sentence and the source attention of the chosen decoder layer as a heatmap (drawn as
// attnmt serve's page draws it). A pasted paragraph is cut into sentences (sentences.js), which
// are translated in one batch and put back with the whitespace between them; the heatmap shows
// the sentence last clicked in the translation (the first at first). A multilingual model's page has a picker of the target language
// (shown where the model has several; a model with one uses it without asking). The translator
// (ONNX Runtime Web's WebAssembly backend with SIMD, the model of ./model/, the search) runs in a
// Web Worker (worker.js), so the page stays responsive while it searches; it uses threads where the
// page is cross-origin isolated (served with COOP/COEP headers), one thread otherwise.
//
// This module is both the page's script and its worker's: `new Worker(import.meta.url)` loads it
// again in a worker, where it serves the translator instead (one file to ship and to cache).
//
// Scripts drive the page without the DOM through window.attnmt = {ready: Promise<void>,
// translate(text, {beamSize, tgtLang}) -> Promise<string>, translateFull, translateBatch,
// translateText, sentences(text), threads(), targetLanguages()}; tgtLang defaults to the picker's
// language.
import { joinTranslations, segmentSentences, sentencesOf } from "./sentences.js";
import { serveTranslator } from "./worker.js";

const inWorker = typeof document === "undefined";
const here = new URL(".", import.meta.url).href;
const numThreads = globalThis.crossOriginIsolated ? Math.min(4, globalThis.navigator?.hardwareConcurrency || 1) : 1;

/**
 * The worker's client: `call(message)` posts a translate request and resolves with its results;
 * `ready` resolves with the loaded model's {config, downloadBytes, threads}.
 */
function startWorker() {
  const worker = new Worker(import.meta.url, { type: "module" });
  const calls = new Map();  // request id -> {resolve, reject, onStep}
  let nextId = 0, loaded, failed;
  const ready = new Promise((resolve, reject) => { loaded = resolve; failed = reject; });
  const failAll = (message) => {
    failed(new Error(message));
    calls.forEach((c) => c.reject(new Error(message)));
    calls.clear();
  };
  worker.addEventListener("message", ({ data }) => {
    if (data.type === "ready") return loaded(data);
    if (data.type === "failed") return failAll(data.message);
    const call = calls.get(data.id);
    if (!call) return;
    if (data.type === "step") {
      call.onStep?.(data);
    } else {
      calls.delete(data.id);
      if (data.type === "done") call.resolve(data.results);
      else call.reject(new Error(data.message));
    }
  });
  worker.addEventListener("error", (e) => failAll(`the translator's worker failed: ${e.message || "could not start"}`));
  worker.postMessage({ type: "load", base: new URL("model/", here).href, numThreads });
  const call = ({ onStep, ...request }) => new Promise((resolve, reject) => {
    const id = nextId++;
    calls.set(id, { resolve, reject, onStep });
    worker.postMessage({ type: "translate", id, stream: Boolean(onStep), ...request });
  });
  return { ready, call };
}

const $ = (id) => document.getElementById(id);

// A subword piece for display: SentencePiece marks a word start with U+2581 (as serve/page.html).
function label(piece) { return piece === "</s>" ? "</s>" : piece.replace(/^\u2581/, "") || "\u2581"; }
function attColor(w) { return `rgba(47, 111, 222, ${Math.min(1, w).toFixed(3)})`; }

/** "French (fr)": the browser's English name of a language code, else the code alone. */
function languageName(code) {
  try {
    const name = new Intl.DisplayNames(["en"], { type: "language" }).of(code.replaceAll("_", "-"));
    return name && name !== code ? `${name} (${code})` : code;
  } catch {
    return code;  // not a BCP 47 tag
  }
}

/** The picker's target language; undefined for a bilingual model (no tag). */
function chosenLanguage() { return $("tgt-lang").value || undefined; }

/** The parts of `text` as the page cuts it into sentences, in the model's source language (a
 * model reading several: the rules common to all languages). */
function sentenceParts(text) {
  return segmentSentences(text, model?.config.src_lang || undefined);
}

function tokenSpan(piece, index) {
  const span = document.createElement("span");
  span.className = "tok" + (piece.startsWith("\u2581") && index > 0 ? " ws" : "") + (piece === "</s>" ? " eos" : "");
  span.textContent = label(piece);
  span.dataset.index = index;
  return span;
}

function showPieces(pieces) {
  const box = $("translation");
  box.replaceChildren(...pieces.map(tokenSpan));
}

/** Whitespace between sentences as the page shows it: a line break per newline, else a space. */
function gap(space) {
  const breaks = (space.match(/\n/g) || []).length;
  if (breaks) return Array.from({ length: breaks }, () => document.createElement("br"));
  return space ? [document.createTextNode(" ")] : [];
}

/** The translated sentences, each a span.sentence of its pieces (a click shows its heatmap), with
 * the source's line breaks between them. */
function showSentences(parts, results) {
  const box = $("translation");
  box.replaceChildren();
  let k = 0;
  for (const part of parts) {
    box.append(...gap(part.before));
    if (part.sentence) {
      const result = results[k];
      const span = document.createElement("span");
      span.className = "sentence";
      span.dataset.index = k++;
      span.dataset.text = result.text;
      span.append(...result.pieces.map(tokenSpan));
      span.addEventListener("click", () => choose(result, span));
      box.append(span);
    }
    box.append(...gap(part.after));
  }
}

/** Show the heatmap of `result`, the sentence `span` of the translation. */
function choose(result, span) {
  last = result;
  document.querySelectorAll("#translation .sentence").forEach((s) => s.classList.toggle("chosen", s === span));
  drawHeatmap(result);
}

/** The rows (T, S) of decoder layer `layer` from the per-token (L, S) attention arrays. */
function layerRows(attention, layer, S) {
  return attention.map((a) => Array.from(a.subarray(layer * S, (layer + 1) * S)));
}

function drawHeatmap(result) {
  const table = $("heatmap");
  table.replaceChildren();
  if (!result || !result.attention.length) return;
  const S = result.srcPieces.length, layer = Number($("layer").value);
  const weights = layerRows(result.attention, layer, S);
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  result.srcPieces.forEach((piece) => { const th = document.createElement("th"); th.textContent = label(piece); head.appendChild(th); });
  const body = table.createTBody();
  weights.forEach((row, i) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = label(result.pieces[i]);
    tr.appendChild(th);
    row.forEach((w, j) => {
      const td = tr.insertCell();
      td.style.background = attColor(w);
      td.title = `${label(result.pieces[i])} \u2192 ${label(result.srcPieces[j])}: ${w.toFixed(3)}`;
    });
  });
}

let last = null;
let model = null;  // the worker's "ready" message: {config, downloadBytes, threads}
let worker = null;

/** The worker's results for `texts` (ready first), into `tgtLang` (default: the picker's). */
async function translateTexts(texts, { beamSize, batchSize, tgtLang, onStep } = {}) {
  await worker.ready;
  return worker.call({ texts, beamSize, batchSize, tgtLang: tgtLang ?? chosenLanguage(), onStep });
}

async function translate(text, { beamSize, tgtLang, onStep } = {}) {
  return (await translateTexts([text], { beamSize, tgtLang, onStep }))[0];
}

/** `text` cut into sentences, their results (translated in one batch; words streamed to `onStep`
 * where there is one sentence) and the translated text. */
async function translateParagraphs(text, { beamSize, tgtLang, onStep } = {}) {
  await worker.ready;  // the model's source language chooses the segmentation rules
  const parts = sentenceParts(text);
  const sentences = sentencesOf(parts);
  const results = sentences.length ? await translateTexts(sentences, {
    beamSize, tgtLang, onStep: sentences.length === 1 ? onStep : undefined }) : [];
  return { parts, results, text: joinTranslations(parts, results.map((r) => r.text)) };
}

async function translateFromPage() {
  const button = $("translate"), status = $("status");
  const beamSize = Math.max(1, parseInt($("beam-size").value, 10) || 1);
  button.disabled = true;
  status.className = "";
  status.textContent = "translating\u2026";
  try {
    const started = performance.now();
    const { parts, results, text } = await translateParagraphs($("source").value, {
      beamSize, onStep: (p) => showPieces(p.pieces) });
    showSentences(parts, results);
    $("translation").dataset.text = text;
    const first = document.querySelector("#translation .sentence");
    if (first) choose(results[0], first);
    else drawHeatmap(last = null);
    const n = results.length;
    status.textContent = `${n === 1 ? "" : `${n} sentences `}translated in ${Math.round(performance.now() - started)} `
      + `ms (${beamSize === 1 ? "greedy" : `beam ${beamSize}`}, ${threadsText()})`;
  } catch (e) {
    status.className = "error";
    status.textContent = `error: ${e.message}`;
  } finally {
    button.disabled = false;
  }
}

function threadsText() {
  const n = model ? model.threads : numThreads;
  return `${n} thread${n > 1 ? "s" : ""}`;
}

function startPage() {
  worker = startWorker();
  const ready = worker.ready.then((loaded) => {
    model = loaded;
    const m = model.config;
    const select = $("layer");
    for (let l = 0; l < m.model.num_decoder_layers; l++) select.add(new Option(`decoder layer ${l}`, String(l)));
    select.value = String(Math.min(m.attention_layer, m.model.num_decoder_layers - 1));
    $("beam-size").value = m.decode.beam_size;
    const targets = m.target_languages ?? [];
    for (const { code } of targets) $("tgt-lang").add(new Option(languageName(code), code));
    $("tgt-lang-label").hidden = targets.length < 2;
    const pair = targets.length ? `\u2192 ${targets.map((l) => l.code).join(", ")} \u00b7 `
      : m.src_lang ? `${m.src_lang} \u2192 ${m.tgt_lang} \u00b7 ` : "";
    $("model-info").textContent = `${pair}${m.model.num_encoder_layers}+${m.model.num_decoder_layers} layers, d_model `
      + `${m.model.d_model}, ${m.quantization} \u00b7 ${(model.downloadBytes / 2 ** 20).toFixed(1)} MiB`;
    $("translate").disabled = false;
    $("status").textContent = `ready (WebAssembly in a worker, ${threadsText()})`;
  });
  ready.catch((e) => { $("status").className = "error"; $("status").textContent = `error: ${e.message}`; });

  $("translate").addEventListener("click", translateFromPage);
  $("source").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translateFromPage(); });
  $("layer").addEventListener("change", () => drawHeatmap(last));

  window.attnmt = {
    ready: ready.then(() => undefined),
    /** Translate `text`; beamSize 1 is greedy search (default: the model's decode.beam_size); tgtLang
     * the language to translate into (a multilingual model's; default: the picker's). */
    translate: async (text, { beamSize, tgtLang } = {}) => (await translate(text, { beamSize, tgtLang })).text,
    /** The whole result: text, token ids, pieces, source pieces, attention, score, ms. */
    translateFull: (text, { beamSize, tgtLang } = {}) => translate(text, { beamSize, tgtLang }),
    /** Whole results for many texts, searched `batchSize` sentences at a time (default 32). */
    translateBatch: (texts, { beamSize, batchSize, tgtLang } = {}) =>
      translateTexts(texts, { beamSize, batchSize, tgtLang }),
    /** A text of any number of sentences and paragraphs, translated sentence by sentence as the
     * page's button does; the whitespace between sentences kept. */
    translateText: async (text, { beamSize, tgtLang } = {}) => (await translateParagraphs(text, { beamSize, tgtLang })).text,
    /** The sentences the page cuts `text` into (sentences.js). */
    sentences: async (text) => { await worker.ready; return sentencesOf(sentenceParts(text)); },
    /** ONNX Runtime Web's threads: 1 unless the page is cross-origin isolated. */
    threads: () => (model ? model.threads : numThreads),
    /** A multilingual model's target language codes ([] for a bilingual model). */
    targetLanguages: () => (model?.config.target_languages ?? []).map((l) => l.code),
  };
}

if (inWorker) serveTranslator(globalThis);
else startPage();
