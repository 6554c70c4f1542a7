// The exported page: ONNX Runtime Web's WebAssembly backend (SIMD; threads when the page is
// cross-origin isolated, i.e. served with COOP/COEP headers; one thread otherwise), the model of
// ./model/, and the DOM: a text box, a translate button, words appearing as they are decoded,
// the time per sentence and the source attention of the chosen decoder layer as a heatmap
// (drawn as attnmt serve's page draws it).
//
// Scripts drive it without the DOM through
//   window.attnmt = {ready: Promise<void>, translate(text, {beamSize}) -> Promise<string>, ...}.
import * as ort from "onnxruntime-web/wasm";
import { Translator } from "./translator.js";

const here = new URL(".", import.meta.url).href;
ort.env.wasm.wasmPaths = here;  // ort-wasm-simd-threaded.{mjs,wasm} lie beside this module
ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;

const $ = (id) => document.getElementById(id);
let translator = null;

// A subword piece for display: SentencePiece marks a word start with U+2581 (as serve/page.html).
function label(piece) { return piece === "</s>" ? "</s>" : piece.replace(/^\u2581/, "") || "\u2581"; }
function attColor(w) { return `rgba(47, 111, 222, ${Math.min(1, w).toFixed(3)})`; }

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
let queue = Promise.resolve();  // one translation at a time: a session runs one step at a time

function translate(text, { beamSize, onStep } = {}) {
  const result = queue.then(() => ready).then(() => translator.translate(text, { beamSize, onStep }));
  queue = result.catch(() => {});
  return result;
}

async function translateFromPage() {
  const button = $("translate"), status = $("status");
  const beamSize = Math.max(1, parseInt($("beam-size").value, 10) || 1);
  button.disabled = true;
  status.className = "";
  status.textContent = "translating\u2026";
  try {
    const result = await translate($("source").value, { beamSize, onStep: (p) => showPieces(p.pieces) });
    last = result;
    showPieces(result.pieces);
    $("translation").dataset.text = result.text;
    drawHeatmap(result);
    status.textContent = `translated in ${Math.round(result.ms)} ms (${beamSize === 1 ? "greedy" : `beam ${beamSize}`}, `
      + `${ort.env.wasm.numThreads} thread${ort.env.wasm.numThreads > 1 ? "s" : ""})`;
  } catch (e) {
    status.className = "error";
    status.textContent = `error: ${e.message}`;
  } finally {
    button.disabled = false;
  }
}

const ready = (async () => {
  translator = await Translator.load(ort, new URL("model/", here).href);
  const m = translator.config;
  const select = $("layer");
  for (let l = 0; l < m.model.num_decoder_layers; l++) select.add(new Option(`decoder layer ${l}`, String(l)));
  select.value = String(Math.min(m.attention_layer, m.model.num_decoder_layers - 1));
  $("beam-size").value = m.decode.beam_size;
  const pair = m.src_lang ? `${m.src_lang} \u2192 ${m.tgt_lang} \u00b7 ` : "";
  $("model-info").textContent = `${pair}${m.model.num_encoder_layers}+${m.model.num_decoder_layers} layers, d_model `
    + `${m.model.d_model}, ${m.quantization} \u00b7 ${(translator.downloadBytes / 2 ** 20).toFixed(1)} MiB`;
  $("translate").disabled = false;
  $("status").textContent = `ready (WebAssembly, ${ort.env.wasm.numThreads} thread${ort.env.wasm.numThreads > 1 ? "s" : ""})`;
})();
ready.catch((e) => { $("status").className = "error"; $("status").textContent = `error: ${e.message}`; });

$("translate").addEventListener("click", translateFromPage);
$("source").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translateFromPage(); });
$("layer").addEventListener("change", () => drawHeatmap(last));

window.attnmt = {
  ready,
  /** Translate `text`; beamSize 1 is greedy search (default: the model's decode.beam_size). */
  translate: async (text, { beamSize } = {}) => (await translate(text, { beamSize })).text,
  /** The whole result: text, token ids, pieces, source pieces, attention, score, ms. */
  translateFull: translate,
  threads: () => ort.env.wasm.numThreads,
  /** The loaded Translator (translator.js), once ready. */
  translator: () => translator,
};
